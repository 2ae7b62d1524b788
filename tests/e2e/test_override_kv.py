"""--override-kv KEY=TYPE:VALUE on a real server: the keys with an MLX
analogue act (the training context caps the slot, the tokenizer's EOS rule
changes what /tokenize returns with special tokens), and any other key stops
startup before the model loads, naming the option, the value and the keys
that are honoured (cli/override_kv.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

pytestmark = pytest.mark.e2e


def _tokens(srv, add_special: bool) -> list[int]:
    r = httpx.post(f"{srv.url}/tokenize", json={"content": "hello world",
                                                "add_special": add_special}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_mapped_keys_act(tiny_model, start_server):
    srv = start_server(tiny_model, "-c", "2048", "-np", "1", "--override-kv",
                       "qwen3.context_length=int:512,tokenizer.ggml.add_eos_token=bool:true")
    # the overridden training context caps the slot, with upstream's warning
    srv.wait_for_text("exceeds the training context of the model (512) - capping")
    props = httpx.get(f"{srv.url}/props", timeout=30).json()
    assert props["default_generation_settings"]["n_ctx"] == 512
    meta = httpx.get(f"{srv.url}/v1/models", timeout=30).json()["data"][0]["meta"]
    assert meta["n_ctx_train"] == 512
    plain, special = _tokens(srv, False), _tokens(srv, True)
    eos = httpx.post(f"{srv.url}/tokenize", json={"content": "<|im_end|>"},
                     timeout=30).json()["tokens"]
    assert special == plain + eos, (plain, special, eos)


def test_a_key_without_analogue_stops_startup(tiny_model):
    proc = subprocess.run(
        [sys.executable, "-m", "mlxcel_trio", "-m", str(tiny_model),
         "--override-kv", "tokenizer.ggml.add_bos_token=bool:false,general.name=str:x"],
        env=os.environ, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    line = errors[0]
    assert "--override-kv" in line and "general.name" in line, line
    assert "ARCH.context_length" in line, "the honoured keys are the alternative"
    assert "model loaded" not in proc.stdout

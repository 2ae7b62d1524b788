"""mlxcel-trio's own runtime choices on a real server: the BLAS it preloads
by itself (--blas) and the CPU weight policy (--weights)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlxcel_trio import blas

from .sse import post

pytestmark = pytest.mark.e2e


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", blas.MARK, blas.ENV, "MLXCEL_WEIGHTS", *blas.THREAD_VARS)}
    return {**env, "LD_PRELOAD": "", blas.ENV: blas.AUTO}


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD is Linux's")
def test_the_server_preloads_a_blas_it_finds_or_says_how_to_install_one(tiny_model,
                                                                        start_server):
    srv = start_server(tiny_model, "-np", "1", env=_clean_env())
    lib = blas.find()
    if lib is not None:
        name = "MKL" if "mkl" in lib.name else "OpenBLAS"
        srv.wait_for_text(f"BLAS: {name} (preloaded from {lib}; --blas bundled opts out)")
        assert str(lib.resolve()) in _maps(srv.proc.pid)
        # the tiny model's matmuls are too small to split across threads
        srv.wait_for_text(f"BLAS: {name} on one thread")
    else:
        srv.wait_for_text(blas.install_hint())
    srv.stop()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD is Linux's")
def test_blas_bundled_keeps_the_wheels_own(tiny_model, start_server):
    srv = start_server(tiny_model, "-np", "1", "--blas", "bundled", env=_clean_env())
    srv.wait_for_text("BLAS: reference BLAS (single-threaded)")
    assert "libopenblas" not in _maps(srv.proc.pid) and "libmkl" not in _maps(srv.proc.pid)
    assert not any("no faster BLAS" in line for line in srv.stdout + srv.stderr)
    srv.stop()


def test_a_missing_blas_library_is_refused_before_loading(tiny_model):
    proc = subprocess.run([sys.executable, "-m", "mlxcel_trio", "-m", str(tiny_model),
                           "--blas", "/nowhere/libblas.so"], check=False, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: --blas '/nowhere/libblas.so': no such library")


def _greedy(srv) -> tuple[str, list[int]]:
    j = post(srv.url, {"prompt": "The engine", "n_predict": 16, "temperature": 0,
                       "n_probs": 1, "ignore_eos": True}).json()
    return j["content"], [p["id"] for p in j["completion_probabilities"]]


def test_a_bf16_checkpoint_served_in_float32_equals_its_float32_form(
        start_server, shared_server):
    from fixtures.build import ensure

    converted = start_server(ensure("tiny-bf16"), "-np", "1", "--weights", "float32")
    converted.wait_for_text("weights converted from bfloat16 to float32")
    converted.wait_for_text("weights float32")
    # the float32 reference only answers greedy requests: one per worker
    reference = shared_server(ensure("tiny-bf16-f32"), "-np", "1")
    assert _greedy(converted) == _greedy(reference)
    converted.stop()


def test_keep_serves_a_quantized_checkpoint_as_stored(start_server):
    from fixtures.build import ensure

    srv = start_server(ensure("tiny-4bit"), "-np", "1", "--weights", "keep")
    srv.wait_for_text("weights 4-bit")
    assert not any("weights converted" in line for line in srv.stdout + srv.stderr)
    srv.stop()

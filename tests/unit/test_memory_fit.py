"""memory_fit: the prompt cache's default budget follows the machine, and a
configuration that cannot fit is refused with its figures."""

from __future__ import annotations

import json

import attrs
import pytest

from mlxcel_trio import memory_fit
from mlxcel_trio.config import ServerConfig

MIB = 1 << 20
GIB = 1 << 30


@pytest.fixture
def checkpoint(tmp_path):
    """A Qwen3-0.6B-shaped config.json over 1 GiB of (sparse) weights."""
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen3", "num_hidden_layers": 28, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 1024,
        "max_position_embeddings": 40960, "torch_dtype": "bfloat16"}))
    with open(tmp_path / "model.safetensors", "wb") as f:
        f.truncate(GIB)
    return tmp_path


def _config(path, **kw) -> ServerConfig:
    return ServerConfig(model=str(path), **kw)


def test_an_unset_budget_is_a_quarter_of_what_the_weights_leave(checkpoint):
    fit = memory_fit.size(_config(checkpoint, cache_ram_auto=True, ctx_size=4096),
                          available=9 * GIB)
    assert fit.problem is None and fit.warning is None
    assert fit.config.cache_ram == 2048          # (9 - 1) GiB / 4
    assert fit.summary.startswith("cache_ram = 2048 MiB (sized to this machine")


def test_upstreams_8192_is_the_ceiling(checkpoint):
    fit = memory_fit.size(_config(checkpoint, cache_ram_auto=True, ctx_size=4096),
                          available=200 * GIB)
    assert fit.config.cache_ram == 8192


def test_a_given_budget_is_kept_when_it_fits(checkpoint):
    fit = memory_fit.size(_config(checkpoint, cache_ram=4096, ctx_size=4096),
                          available=9 * GIB)
    assert (fit.config.cache_ram, fit.summary, fit.problem) == (4096, None, None)


def test_a_given_budget_that_cannot_fit_is_refused_with_its_figures(checkpoint):
    fit = memory_fit.size(_config(checkpoint, cache_ram=8192, ctx_size=4096),
                          available=6 * GIB)
    assert fit.problem == (
        "--cache-ram 8192: the model's 1024 MiB plus a prompt cache of 8192 MiB need "
        "9216 MiB, but only 6144 MiB is available; lower --cache-ram, or leave it unset "
        "to size it to this machine")


def test_weights_larger_than_memory_are_refused(checkpoint):
    fit = memory_fit.size(_config(checkpoint, cache_ram_auto=True), available=512 * MIB)
    assert fit.problem.startswith("the model's weights take 1024 MiB, more than the 512 MiB")


def test_a_full_context_that_cannot_fit_is_a_warning(checkpoint):
    # 28 layers x 8 heads x 128 x (2 + 2) bytes = 112 KiB a token; 40960 tokens = 4480 MiB
    assert memory_fit.kv_bytes_per_token(checkpoint, ("f16", "f16")) == 112 * 1024
    fit = memory_fit.size(_config(checkpoint, cache_ram=0), available=4 * GIB)
    assert fit.problem is None
    assert fit.warning.startswith("a full context on every slot (40960 tokens, 4480 MiB of KV)")
    # a quantized KV cache costs less: 8 bits plus a scale and bias per 32
    assert memory_fit.kv_bytes_per_token(checkpoint, ("q8_0", "q8_0")) == 28 * 8 * 128 * 2.25


def test_nothing_is_checked_where_the_os_does_not_say(checkpoint, monkeypatch):
    monkeypatch.setattr(memory_fit, "available_bytes", lambda: None)
    config = _config(checkpoint, cache_ram_auto=True)
    assert memory_fit.size(config) == memory_fit.Fit(config)
    assert attrs.evolve(config).cache_ram == 8192

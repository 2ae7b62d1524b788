"""Chunk reuse by shifting cached KV (engine/kv_shift.py, --cache-reuse):
upstream's walk over the cached tokens, and the re-rotation, which for a
one-layer model (whose K/V depend only on token and position) must give
exactly the logits of a fresh prefill."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import llama
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

from mlxcel_trio.engine import kv_shift
from mlxcel_trio.engine.prompt_cache import PromptCache


def _walk(cached, prompt, n_past, n, limit=None):
    """upstream's skip-by-one walk, written out token by token"""
    limit = len(prompt) - 1 if limit is None else limit
    head_c = head_p = n_past
    segs = [(0, 0, n_past)] if n_past else []
    while head_c < len(cached) and head_p < limit:
        m = 0
        while (head_c + m < len(cached) and head_p + m < limit
               and cached[head_c + m] == prompt[head_p + m]):
            m += 1
        if m >= n:
            segs.append((head_c, head_p, m))
            head_c, head_p = head_c + m, head_p + m
        else:
            head_c += 1
    return head_p, segs


@pytest.mark.parametrize("seed", range(40))
def test_plan_is_upstreams_walk(seed):
    rng = np.random.default_rng(seed)
    cached = rng.integers(0, 4, size=int(rng.integers(5, 60)))
    prompt = cached.copy()
    # edits: cut a span, insert noise, change a token
    a, b = sorted(rng.integers(0, len(prompt), size=2))
    prompt = np.concatenate([prompt[:a], rng.integers(0, 4, size=int(rng.integers(0, 5))),
                             prompt[b:]])
    if len(prompt) < 2:
        return
    n_past = int(np.argmin(np.concatenate([cached[:len(prompt)] == prompt[:len(cached)],
                                           [False]])))
    n_past = min(n_past, len(prompt) - 1)
    n = int(rng.integers(1, 6))
    assert kv_shift.plan(cached, prompt, n_past, n, len(prompt) - 1) == _walk(
        list(cached), list(prompt), n_past, n)


def _tiny_model(n_layers: int = 1) -> llama.Model:
    mx.random.seed(3)
    args = llama.ModelArgs(model_type="llama", hidden_size=32, num_hidden_layers=n_layers,
                           intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                           rms_norm_eps=1e-5, vocab_size=50, rope_theta=10000.0)
    model = llama.Model(args)
    mx.eval(model.parameters())
    return model


def _prefill(model, tokens, cache=None):
    cache = cache if cache is not None else make_prompt_cache(model)
    logits = model(mx.array([tokens]), cache=cache)
    mx.eval(logits)
    return logits[0, -1], cache


def test_a_shifted_chunk_gives_a_fresh_prefills_logits():
    model = _tiny_model()
    cached = list(range(1, 41))                       # 40 tokens, all distinct
    prompt = cached[:10] + cached[18:] + [47]   # 8 cut out, one appended
    _, layers = _prefill(model, cached)
    shifter, why = kv_shift.for_model(model, make_prompt_cache(model))
    assert why is None
    pc = PromptCache(None)
    assert pc.donate("ns", cached, layers)
    n, adopted = pc.lookup("ns", prompt, 8, shifter)
    # the prefix (10) and the chunk after the cut, all but the prompt's last token (upstream
    # walks the cached tokens only: a token inserted into the prompt ends the reuse)
    assert n == len(prompt) - 1 and pc.stats()["reused_shifted"] == n - 10
    shifted, _ = _prefill(model, prompt[n:], adopted)
    fresh, _ = _prefill(model, prompt)
    assert mx.abs(shifted - fresh).max().item() < 1e-4
    # without shifting the prefix alone is reused, and the stored entry is untouched
    n0, plain = pc.lookup("ns", prompt)
    assert n0 == 10
    assert mx.abs(_prefill(model, prompt[10:], plain)[0] - fresh).max().item() < 1e-4


def test_a_chunk_shorter_than_the_minimum_is_not_reused():
    model = _tiny_model()
    cached = list(range(1, 31))
    prompt = cached[:5] + cached[10:16] + [46, 47]
    pc = PromptCache(None)
    pc.donate("ns", cached, _prefill(model, cached)[1])
    shifter, _ = kv_shift.for_model(model, make_prompt_cache(model))
    assert pc.lookup("ns", prompt, 7, shifter)[0] == 5
    assert pc.lookup("ns", prompt, 6, shifter)[0] == 11


def test_models_whose_keys_cannot_be_shifted_say_why():
    model = _tiny_model()
    assert "RotatingKVCache" in kv_shift.for_model(model, [RotatingKVCache(8)])[1]
    # -ctk q8_0 on a sliding-window model: windows beside a quantized store
    from mlxcel_trio.engine.kv_cache import CacheFactory

    fake = type("M", (), {"make_cache": lambda self: [RotatingKVCache(8), KVCache()]})()
    why = kv_shift.for_model(model, CacheFactory(fake, "q8_0", "q8_0")())[1]
    assert "RotatingKVCache, StoredKVCache layers" in why
    model.layers[0].self_attn.rope = object()
    assert "scales the keys" in kv_shift.for_model(model, [KVCache()])[1]

"""The prompt cache on its own: leaves, lookup, LRU by bytes, and aliasing."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache

from mlxcel_trio.engine.prompt_cache import PromptCache, adopt, budget_from_mib

H, D = 2, 4
PER_TOKEN = 2 * H * D * 4  # keys + values, float32, one layer


def kv(tokens, layers=2, seed=0):
    """Per-layer KVCaches holding len(tokens) positions of recognizable data."""
    n = len(tokens)
    out = []
    for i in range(layers):
        c = KVCache()
        base = mx.array(np.arange(n * H * D, dtype=np.float32).reshape(1, H, n, D)
                        + 1000 * i + seed)
        c.keys, c.values, c.offset = base, base + 0.5, n
        out.append(c)
    return out


def test_longest_prefix_wins_and_leaves_one_token_to_evaluate():
    pc = PromptCache(None)
    assert pc.donate("ns", [1, 2, 3], kv([1, 2, 3]))
    assert pc.donate("ns", [1, 2, 9, 9, 9], kv([1, 2, 9, 9, 9]))
    n, layers = pc.lookup("ns", [1, 2, 3, 4])
    assert n == 3 and all(c.offset == 3 for c in layers)
    n, _ = pc.lookup("ns", [1, 2, 9, 9, 9, 7])
    assert n == 5
    # the whole prompt cached: one token is still fed
    n, layers = pc.lookup("ns", [1, 2, 3])
    assert n == 2 and layers[0].keys.shape[2] == 2
    assert pc.lookup("ns", [7, 1, 2]) == (0, None)
    assert pc.lookup("ns", [1]) == (0, None)


def test_namespaces_never_share_entries():
    pc = PromptCache(None)
    pc.donate("raw", [1, 2, 3, 4], kv([1, 2, 3, 4]))
    assert pc.lookup("chat", [1, 2, 3, 4, 5]) == (0, None)
    assert pc.lookup("raw", [1, 2, 3, 4, 5])[0] == 4


def test_only_leaves_are_kept():
    pc = PromptCache(None)
    pc.donate("ns", [1, 2], kv([1, 2]))
    assert pc.donate("ns", [1, 2, 3, 4], kv([1, 2, 3, 4]))
    assert len(pc) == 1                                   # [1, 2] was absorbed
    assert not pc.donate("ns", [1, 2, 3], kv([1, 2, 3]))  # already covered
    assert len(pc) == 1 and pc.nbytes == 4 * PER_TOKEN * 2


def test_lru_eviction_keeps_the_budget():
    per_entry = 8 * PER_TOKEN * 2
    pc = PromptCache(3 * per_entry)
    for i in range(10):
        toks = [100 + i] + list(range(7))
        assert pc.donate("ns", toks, kv(toks))
        assert pc.nbytes <= pc.budget
        if i == 4:
            pc.lookup("ns", [100 + 3] + list(range(7)) + [1])  # touch entry 3
    assert len(pc) == 3
    assert pc.peak_nbytes <= pc.budget
    survivors = {int(e.tokens[0]) for e in pc._lru.values()}
    assert survivors == {107, 108, 109}
    # an entry larger than the whole budget is not stored
    big = list(range(50))
    assert not pc.donate("ns", big, kv(big))


def test_budget_sentinels_and_clear():
    assert budget_from_mib(-1) is None
    assert budget_from_mib(2) == 2 * 1024 * 1024
    pc = PromptCache(None)
    pc.donate("ns", [1, 2, 3], kv([1, 2, 3]))
    pc.clear()
    assert len(pc) == 0 and pc.nbytes == 0 and pc.lookup("ns", [1, 2, 3, 4]) == (0, None)


def test_adopted_caches_never_alias_the_store():
    """mlx-lm writes new tokens into KVCache buffers by slice assignment: an
    adopter writing must never change what the store holds."""
    pc = PromptCache(None)
    toks = list(range(6))
    stored = kv(toks)
    before = [np.array(c.keys) for c in stored]
    pc.donate("ns", toks, stored)
    n, layers = pc.lookup("ns", toks + [99])
    assert n == 6
    for c, s in zip(layers, stored):
        assert c.keys is not s.keys and c.values is not s.values
    # write through the adopted cache exactly as a forward pass would
    for c in layers:
        new = mx.full((1, H, 3, D), -7.0)
        c.update_and_fetch(new, new)
        c.keys[..., :2, :] = mx.zeros((1, H, 2, D))   # and a direct slice write
    mx.eval([c.keys for c in layers])
    for c, b in zip(stored, before):
        np.testing.assert_array_equal(np.array(c.keys), b)
    # a second adopter still sees the original prefix
    _, again = pc.lookup("ns", toks + [98])
    np.testing.assert_array_equal(np.array(again[0].keys), before[0])


def test_adopt_slices_to_n():
    layers = kv([1, 2, 3, 4, 5])
    got = adopt(layers, 3)
    assert got[0].offset == 3 and got[0].keys.shape[2] == 3
    np.testing.assert_array_equal(np.array(got[0].keys), np.array(layers[0].keys)[:, :, :3])


@pytest.mark.parametrize("mib", [0, 1, 8192])
def test_budget_from_mib(mib):
    assert budget_from_mib(mib) == mib * 1024 * 1024

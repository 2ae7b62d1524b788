"""engine/samplers/history.py: logit bias, repetition penalties and DRY
against the numpy reference, and the breaker derivation on a toy vocab.

White-box: reads the history's private `_z_values`."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_trio.engine.samplers import history as H

from . import _reference as ref

V = 32


def test_dense_bias_adds_repeats_bans_and_ignores_out_of_range():
    vec = np.array(H.dense_bias([(1, 2.0), (1, 0.5), (3, -math.inf), (99, 1.0), (-1, 1.0)], V))
    assert vec[1] == 2.5 and vec[3] == -np.inf and vec.sum() == -np.inf
    assert H.dense_bias([(99, 1.0)], V) is None


@pytest.mark.parametrize("kw", [
    dict(repeat=1.3, freq=0.0, present=0.0),
    dict(repeat=1.0, freq=0.4, present=0.0),
    dict(repeat=1.0, freq=0.0, present=0.7),
    dict(repeat=0.8, freq=-0.2, present=0.3),
])
@pytest.mark.parametrize("last_n", [1, 4, 64])
def test_penalties_match_the_reference(kw, last_n):
    rng = np.random.default_rng(last_n)
    x = (rng.standard_normal(V) * 3).astype(np.float32)
    hist = rng.integers(0, 8, size=20).tolist()
    window = mx.array(hist[-last_n:], dtype=mx.int32)
    got = np.array(H.penalize(mx.array(x[None, :]), window, V, kw["repeat"], kw["freq"],
                              kw["present"]))[0]
    want = ref.penalties(x, hist, last_n, kw["repeat"], kw["freq"], kw["present"])
    assert np.allclose(got, want, atol=1e-5)


def test_z_values():
    s = [1, 2, 1, 2, 1, 3]
    z = H._z_values(s)
    for k in range(1, len(s)):
        m = 0
        while k + m < len(s) and s[m] == s[k + m]:
            m += 1
        assert z[k] == m


DRY_CASES = [
    # history, breakers (head -> tails), allowed
    ([1, 2, 3, 4, 1, 2, 3], {}, 2),
    ([1, 2, 3, 4, 1, 2, 3], {}, 1),
    ([5, 5, 5, 5, 5, 5], {}, 2),
    ([1, 2, 3, 9, 1, 2, 3], {9: [()]}, 2),              # 9 breaks the run
    ([1, 2, 7, 8, 1, 2, 7], {7: [(8,)]}, 1),            # 7 8 is a two-token breaker
    ([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3], {3: [()]}, 2),  # 3 itself never penalised
    ([4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2], {}, 0),
]


@pytest.mark.parametrize(("hist", "breakers", "allowed"), DRY_CASES)
@pytest.mark.parametrize("last_n", [5, 64])
def test_dry_matches_the_reference(hist, breakers, allowed, last_n):
    b = H.Breakers({k: list(v) for k, v in breakers.items()})
    got = H.dry_penalties(hist[-last_n:], b, 0.8, 1.75, allowed)
    want = ref.dry(hist, breakers, 0.8, 1.75, allowed, last_n)
    assert got.keys() == want.keys()
    assert all(abs(got[k] - want[k]) < 1e-9 for k in got)


def test_dry_penalty_exponent_is_capped():
    hist = [7] * 300
    got = H.dry_penalties(hist, H.Breakers({}), 1.0, 3.0, 2)
    assert math.isfinite(got[7]) and got[7] == 3.0 ** int(88.7228391 / math.log(3.0))


def test_apply_dry_subtracts():
    x = mx.zeros((1, V))
    out = np.array(H.apply_dry(x, {3: 1.5, 4: 0.25}))[0]
    assert out[3] == -1.5 and out[4] == -0.25 and out.sum() == -1.75


def test_breakers_come_from_a_vocabulary_scan():
    pieces = [b"a", b"b:", b"x\n", b"\n", b"ab", b"c*", b"q", b"*"]
    toks = {"b": [1], "": []}

    def tokenize(text):
        return toks.get(text, [6])

    got = H.derive_breakers(("\n", ":", "*", "ab"), pieces, tokenize)
    # single-token breakers: any piece containing one
    assert {1, 2, 3, 4, 5, 7} <= got.single
    # "a" ends with a prefix of "ab": head 0, tail tokenize("b")
    assert got.heads[0] == [(1,)]


def test_breakers_are_cut_to_forty_bytes():
    long = "x" * 50
    got = H.derive_breakers((long,), [b"x" * 45, b"x" * 39], lambda s: [len(s)])
    # every suffix of the 39-byte piece starts the breaker: one tail per offset
    assert 0 in got.single and sorted(got.heads[1]) == [(n,) for n in range(1, 40)]

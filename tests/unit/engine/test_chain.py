"""engine/samplers/chain.py and mirostat.py against the numpy reference
(_reference.py): every stage alone, the whole chain in upstream's order,
per-row parameters in one batch, and the edge cases (min_keep, -inf and
NaN logits, everything filtered)."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_trio.protocol.records import DEFAULT_CHAIN, SamplingParams
from mlxcel_trio.engine.samplers import chain, mirostat

from . import _reference as ref

V = 64
NEUTRAL = dict(top_k=0, top_p=1.0, min_p=0.0, temperature=1.0)


def logits(seed: int, scale: float = 3.0, n: int = V) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)


def ours(rows, params, chance=None, u=0.5, ada=None):
    """Run the chain on several rows at once; {token: p} per row."""
    x = mx.array(np.stack(rows))
    n = len(rows)
    cp = chain.ChainParams.build(params, x.shape[-1])
    cx = mx.array([[c] for c in (chance or [1.0] * n)], dtype=mx.float32)
    ud = mx.full((n, 1), u, dtype=mx.float32)
    ada = ada or (None, None)
    d = chain.run(x, cp, cx, ud, *ada)
    ids, probs = np.array(d.ids), np.array(d.probs)
    out = [{int(i): float(q) for i, q in zip(ids[r], probs[r]) if q > 0} for r in range(n)]
    return out, d


def close(a: dict, b: dict, tol=2e-5) -> bool:
    """Same distribution: every token's probability within tol (a token
    missing on one side has probability 0 there)."""
    keys = a.keys() | b.keys()
    return all(abs(a.get(k, 0.0) - b.get(k, 0.0)) < tol for k in keys)


def P(**kw) -> SamplingParams:
    return SamplingParams(**{**NEUTRAL, **kw})


# -- each stage alone ------------------------------------------------------------

STAGES = [
    ("top_n_sigma", dict(top_n_sigma=1.0)),
    ("top_n_sigma", dict(top_n_sigma=0.3)),
    ("top_k", dict(top_k=5)),
    ("top_k", dict(top_k=1)),
    ("typical", dict(typical_p=0.5)),
    ("typical", dict(typical_p=0.9, min_keep=7)),
    ("top_p", dict(top_p=0.5)),
    ("top_p", dict(top_p=0.0)),
    ("top_p", dict(top_p=0.3, min_keep=6)),
    ("min_p", dict(min_p=0.2)),
    ("min_p", dict(min_p=0.9, min_keep=4)),
    ("xtc", dict(xtc_probability=1.0, xtc_threshold=0.05)),
    ("xtc", dict(xtc_probability=1.0, xtc_threshold=0.01, min_keep=60)),
    ("temperature", dict(temperature=0.5)),
    ("temperature", dict(temperature=0.0)),
    ("temperature", dict(temperature=2.0)),
    ("dynatemp", dict(temperature=1.0, dynatemp_range=0.5, dynatemp_exponent=1.0)),
    ("dynatemp", dict(temperature=0.3, dynatemp_range=0.5, dynatemp_exponent=2.0)),
]


@pytest.mark.parametrize(("stage", "kw"), STAGES, ids=lambda v: str(v))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_stage_matches_the_reference(stage, kw, seed):
    x = logits(seed)
    (got,), _ = ours([x], [P(**kw)])
    want = ref.chain(x, {**NEUTRAL, **kw})
    assert close(got, want)


# -- the chain in order, per-row parameters ------------------------------------------

FULL = [
    dict(),  # upstream's defaults
    dict(top_k=20, top_p=0.9, min_p=0.02, temperature=0.7),
    dict(top_n_sigma=1.5, top_k=30, typical_p=0.95, top_p=0.9, min_p=0.05,
         xtc_probability=1.0, xtc_threshold=0.1, temperature=0.9, dynatemp_range=0.3),
    dict(top_k=0, typical_p=0.8, top_p=0.7, min_keep=3, temperature=1.3),
    dict(top_k=8, min_p=0.5, min_keep=5, xtc_probability=1.0, xtc_threshold=0.02,
         temperature=0.0),
    dict(top_k=3, temperature=math.inf),
]


def test_full_chain_rows_of_one_batch_match_the_reference_each():
    rows = [logits(10 + i) for i in range(len(FULL))]
    params = [SamplingParams(**kw) for kw in FULL]
    got, _ = ours(rows, params)
    for g, x, kw in zip(got, rows, FULL):
        assert close(g, ref.chain(x, kw)), kw


def test_stage_order_matters_and_is_upstreams():
    """top_p before min_p before temperature: a hot temperature applied
    after the filters cannot bring back what they removed."""
    x = logits(3)
    kw = dict(top_k=0, top_p=0.6, min_p=0.1, temperature=5.0)
    (got,), _ = ours([x], [P(**kw)])
    assert close(got, ref.chain(x, {**NEUTRAL, **kw}))
    # what temperature-first would give is a different distribution
    hot = ref.chain(x / 5.0, {**NEUTRAL, "top_p": 0.6, "min_p": 0.1, "temperature": 1.0})
    assert not close(got, hot)


def test_xtc_only_fires_under_its_chance():
    x = logits(4)
    kw = dict(xtc_probability=0.3, xtc_threshold=0.05)
    (fired, idle), _ = ours([x, x], [P(**kw), P(**kw)], chance=[0.2, 0.5])
    assert close(fired, ref.chain(x, {**NEUTRAL, **kw}, chance=0.2))
    assert close(idle, ref.chain(x, {**NEUTRAL, **kw}, chance=0.5))
    assert fired != idle


def test_adaptive_p_transforms_and_reports_the_original_probability():
    x = logits(5)
    kw = dict(top_k=10, temperature=1.0, samplers=DEFAULT_CHAIN + ("adaptive_p",),
              adaptive_target=0.2, adaptive_decay=0.9)
    wsum, wtot = mx.array([[0.2 / 0.1]]), mx.array([[1 / 0.1]])
    (got,), d = ours([x], [P(**kw)], ada=(wsum, wtot))
    want = ref.chain(x, {**NEUTRAL, "top_k": 10, "adaptive": True, "adaptive_target": 0.2,
                         "wsum": 2.0, "wtot": 10.0})
    assert close(got, want)
    before = ref.chain(x, {**NEUTRAL, "top_k": 10})
    tok = int(np.array(d.token)[0])
    assert abs(float(np.array(d.p_before)[0]) - before[tok]) < 1e-5


# -- edge cases ----------------------------------------------------------------------------

def test_minus_inf_logits_are_kept_candidates_but_never_drawn():
    x = logits(6)
    x[:50] = -np.inf
    kw = dict(top_k=0, top_p=1.0, min_p=0.0, min_keep=30, typical_p=0.5, temperature=1.0,
              dynatemp_range=0.5)
    (got,), _ = ours([x], [P(**kw)])
    assert close(got, ref.chain(x, {**NEUTRAL, **kw}))
    assert all(t >= 50 for t in got)


def test_nan_logits_count_as_minus_inf():
    x = logits(7)
    x[[1, 5, 9]] = np.nan
    (got,), _ = ours([x], [P(top_k=10)])
    assert close(got, ref.chain(x, {**NEUTRAL, "top_k": 10}))
    assert not {1, 5, 9} & got.keys()


def test_plus_inf_logits_share_the_mass():
    x = logits(12)
    x[[3, 7]] = np.inf
    (got,), _ = ours([x], [P(top_k=10)])
    assert got.keys() == {3, 7} and abs(got[3] - 0.5) < 1e-6


def test_everything_filtered_still_draws_a_token():
    x = np.full(V, -np.inf, dtype=np.float32)
    got, d = ours([x], [SamplingParams()])
    tok = int(np.array(d.token)[0])
    assert 0 <= tok < V and got == [{}]


def test_temperature_zero_keeps_only_the_best():
    x = logits(8)
    (got,), _ = ours([x], [P(temperature=0.0)])
    assert got == {int(np.argmax(x)): 1.0}


def test_top_k_larger_than_the_vocabulary_keeps_everything():
    x = logits(9, n=16)
    (got,), _ = ours([x], [P(top_k=1000)])
    assert close(got, ref.chain(x, NEUTRAL))


# -- the draw ---------------------------------------------------------------------------------

def test_draw_is_the_inverse_cdf():
    p = mx.array([[0.1, 0.0, 0.6, 0.3]])
    picks = [int(np.array(chain.draw(p, mx.array([[u]])))[0, 0]) for u in
             (0.0, 0.05, 0.1, 0.11, 0.69, 0.71, 0.999)]
    assert picks == [0, 0, 0, 2, 2, 3, 3]


def test_draw_frequencies_match_the_distribution():
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.25, 0.125, 0.0625, 0.0625], dtype=np.float32)
    u = rng.random((20000, 1)).astype(np.float32)
    picks = np.array(chain.draw(mx.array(np.tile(p, (20000, 1))), mx.array(u)))[:, 0]
    freq = np.bincount(picks, minlength=5) / 20000
    assert np.allclose(freq, p, atol=0.012)


# -- mirostat -----------------------------------------------------------------------------------

@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("mu", [3.0, 6.0, 10.0])
def test_mirostat_truncation_and_mu_update(version, mu):
    x = logits(11, scale=2.0)
    params = SamplingParams(mirostat=version, mirostat_tau=5.0, mirostat_eta=0.1,
                            temperature=0.8)
    mp = mirostat.MirostatParams.build([params])
    d, mu_new = mirostat.run(mx.array(x[None, :]), mp, mx.array([[mu]]), mx.array([[0.37]]), V)
    got = {int(i): float(q) for i, q in zip(np.array(d.ids)[0], np.array(d.probs)[0]) if q > 0}
    if version == 1:
        want, update = ref.mirostat_v1(x, 0.8, 5.0, 0.1, mu, V)
    else:
        want, update = ref.mirostat_v2(x, 0.8, 5.0, 0.1, mu)
    assert close(got, want, tol=1e-4)
    tok = int(np.array(d.token)[0])
    assert abs(float(np.array(mu_new)[0, 0]) - update(tok)) < 1e-3

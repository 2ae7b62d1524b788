"""engine/samplers/batch.py and engine/sampling.py: the per-row processor
and the shared sampler, driven the way mlx-lm's GenerationBatch drives
them (processors in row order, then one sampler call)."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_trio.protocol.records import DEFAULT_CHAIN, SamplingParams
from mlxcel_trio.engine.samplers.batch import BatchSampler, Row
from mlxcel_trio.engine.sampling import GREEDY, is_greedy, plan

from . import _reference as ref

V = 48


def fixed_logits(seed=0, scale=2.5):
    return (np.random.default_rng(seed).standard_normal(V) * scale).astype(np.float32)


class Mask:
    """A stand-in grammar constraint: a fixed allowed set."""

    def __init__(self, allowed):
        m = np.zeros((1, V), dtype=bool)
        m[0, list(allowed)] = True
        self.m = mx.array(m)

    def mask_for(self, history):
        return self.m


def step(batch, rows, logits, context=(1, 2, 3)):
    """One GenerationBatch step: processors, normalization, one call."""
    ctx = mx.array(list(context), dtype=mx.int32)
    processed = [r.process(ctx, mx.array(x[None, :])) for r, x in zip(rows, logits)]
    x = mx.concatenate(processed, axis=0)
    logprobs = x - mx.logsumexp(x, axis=-1, keepdims=True)
    return np.array(batch(logprobs)).tolist()


def rows_for(batch, params, **kw):
    return [Row(p, V, sampler=batch, **kw) for p in params]


def test_a_seeded_row_draws_the_same_whatever_shares_its_batch():
    xs = [fixed_logits(i) for i in range(12)]
    solo_b = BatchSampler(V)
    (solo,) = rows_for(solo_b, [SamplingParams(seed=42)])
    alone = [step(solo_b, [solo], [x])[0] for x in xs]

    mixed_b = BatchSampler(V)
    rows = rows_for(mixed_b, [SamplingParams(seed=7, top_k=0), SamplingParams(seed=42),
                              SamplingParams(seed=9, mirostat=2),
                              SamplingParams(seed=1, temperature=3.0)])
    together = [step(mixed_b, rows, [x, x, x, x])[1] for x in xs]
    assert alone == together


def test_frequencies_match_the_reference_distribution():
    """Many independently seeded rows, one vectorized call: the empirical
    distribution of the draws is upstream's chain distribution."""
    n = 4000
    x = fixed_logits(3, scale=1.5)
    kw = dict(top_k=6, top_p=0.9, min_p=0.05, temperature=1.2)
    batch = BatchSampler(V)
    rows = rows_for(batch, [SamplingParams(seed=s, **kw) for s in range(n)])
    toks = step(batch, rows, [x] * n)
    want = ref.chain(x, kw)
    freq = np.bincount(toks, minlength=V) / n
    for t in range(V):
        p = want.get(t, 0.0)
        assert abs(freq[t] - p) <= 4 * math.sqrt(p * (1 - p) / n) + 1e-9, (t, freq[t], p)


def test_grammar_rows_use_upstreams_rejection_sampling():
    """P(t) = P_chain(t) if the grammar accepts t, plus P(rejected) times
    the grammar-first chain's P(t)."""
    n = 4000
    x = fixed_logits(5, scale=1.5)
    allowed = {int(i) for i in np.argsort(-x)[[1, 3, 6, 7]]}
    kw = dict(top_k=3, top_p=1.0, min_p=0.0, temperature=1.0)
    batch = BatchSampler(V)
    rows = rows_for(batch, [SamplingParams(seed=s, **kw) for s in range(n)],
                    constraint=Mask(allowed))
    toks = step(batch, rows, [x] * n)
    assert set(toks) <= allowed
    first = ref.chain(x, kw)
    masked = np.where(np.isin(np.arange(V), list(allowed)), x, -np.inf)
    second = ref.chain(masked, kw)
    rejected = sum(p for t, p in first.items() if t not in allowed)
    want = {t: (first.get(t, 0.0) if t in allowed else 0.0) + rejected * second.get(t, 0.0)
            for t in range(V)}
    freq = np.bincount(toks, minlength=V) / n
    for t in range(V):
        p = want[t]
        assert abs(freq[t] - p) <= 4 * math.sqrt(p * (1 - p) / n) + 1e-9, (t, freq[t], p)
    # and it is not simply "mask first"
    assert abs(want[int(np.argsort(-x)[1])] - second[int(np.argsort(-x)[1])]) > 0.02


def test_reports_pre_and_post_sampling():
    x = fixed_logits(6)
    kw = dict(top_k=4, temperature=0.7, n_probs=3)
    batch = BatchSampler(V)
    pre, post = rows_for(batch, [SamplingParams(seed=1, **kw),
                                 SamplingParams(seed=1, post_sampling_probs=True, **kw)])
    toks = step(batch, [pre, post], [x, x])
    raw = np.exp(x - x.max())
    raw /= raw.sum()
    ids, ps, tok_p = (np.array(a) for a in pre.reports.popleft())
    assert ids.tolist() == np.argsort(-x)[:3].tolist()
    assert np.allclose(ps, raw[ids], atol=1e-6) and abs(tok_p[0] - raw[toks[0]]) < 1e-6
    ids, ps, tok_p = (np.array(a) for a in post.reports.popleft())
    chain = ref.chain(x, kw)
    assert np.allclose(ps, [chain[i] for i in ids], atol=1e-5)
    assert abs(tok_p[0] - chain[toks[1]]) < 1e-5


def test_mirostat_mu_carries_across_steps():
    batch = BatchSampler(V)
    (row,) = rows_for(batch, [SamplingParams(seed=3, mirostat=2, mirostat_tau=3.0)])
    seen = [float(np.array(row.mu)[0, 0])]
    for i in range(4):
        step(batch, [row], [fixed_logits(i)])
        seen.append(float(np.array(row.mu)[0, 0]))
    assert seen[0] == 6.0 and len(set(seen)) == len(seen)


def test_adaptive_p_moving_average_updates():
    batch = BatchSampler(V)
    (row,) = rows_for(batch, [SamplingParams(seed=3, samplers=DEFAULT_CHAIN + ("adaptive_p",),
                                             adaptive_target=0.4, adaptive_decay=0.5)])
    before = float(np.array(row.ada_sum)[0, 0])
    step(batch, [row], [fixed_logits(1)])
    assert float(np.array(row.ada_total)[0, 0]) == pytest.approx(1.0 + 0.5 * 2.0)
    assert float(np.array(row.ada_sum)[0, 0]) != before


def test_a_call_for_rows_nobody_prepared_fails_loudly():
    batch = BatchSampler(V)
    with pytest.raises(RuntimeError):
        batch(mx.zeros((2, V)))


def test_penalties_and_bias_apply_to_greedy_rows_through_the_processor():
    x = np.zeros(V, dtype=np.float32)
    x[5], x[6] = 2.0, 1.9
    params = SamplingParams(temperature=0.0, repeat_penalty=2.0, repeat_last_n=8,
                            logit_bias=((7, 1.95),))
    sampler, processors, row = plan(params, V, BatchSampler(V))
    assert sampler is GREEDY and processors == [row.process]
    out = processors[0](mx.array([1, 5], dtype=mx.int32), mx.array(x[None, :]))
    assert int(np.array(GREEDY(out))[0]) == 7  # 5 halved to 1.0, 7 biased to 1.95 > 6's 1.9


@pytest.mark.parametrize(("kw", "greedy"), [
    (dict(temperature=0.0), True),
    (dict(temperature=-1.0, mirostat=2), True),
    (dict(temperature=0.0, dynatemp_range=0.5), False),
    (dict(temperature=0.0, typical_p=0.5), False),
    (dict(temperature=0.0, xtc_probability=0.5), False),
    (dict(temperature=0.0, xtc_probability=0.5, xtc_threshold=0.6), True),
    (dict(temperature=0.0, n_probs=1), False),
    (dict(temperature=0.7), False),
])
def test_which_jobs_are_greedy(kw, greedy):
    assert is_greedy(SamplingParams(**kw)) is greedy


def test_plain_greedy_jobs_need_no_processor():
    sampler, processors, _ = plan(SamplingParams(temperature=0.0), V, BatchSampler(V))
    assert sampler is GREEDY and processors == []


def test_parameters_follow_the_rows_even_when_an_id_is_reused():
    import gc

    batch = BatchSampler(V)
    seen: set[int] = set()
    reused = 0
    for i in range(40):  # freed rows' ids get reused: the cache must not key on them
        row = Row(SamplingParams(seed=i, temperature=float(i)), V, sampler=batch)
        assert float(np.array(batch._params([row]).temperature)[0, 0]) == float(i)
        reused += id(row) in seen
        if reused >= 2:  # a reused id has been checked twice: enough
            break
        seen.add(id(row))
        del row
        gc.collect()
    assert reused >= 2, "no row id was reused: the test proves nothing here"

"""Prefix reuse on caches that cannot be cut back: a sliding-window
architecture (tiny-swa, gemma3_text) and a hybrid one (tiny-hybrid, lfm2),
through the scheduler, against cold runs."""

from __future__ import annotations

import pytest

from mlxcel_trio.engine.prompt_cache import PromptCache
from mlxcel_trio.protocol.records import Finished, Job, SamplingParams

from .test_scheduler import of, run

GREEDY = SamplingParams(temperature=0.0)
BASE = tuple(range(40, 140))            # longer than tiny-swa's 32-token window


@pytest.fixture(scope="module", params=["tiny-swa", "tiny-hybrid"])
def loaded(request):
    from fixtures.build import ensure
    from mlx_lm.utils import load_model

    from mlxcel_trio.engine.vocab import Vocab

    path = ensure(request.param)
    model, _ = load_model(path)
    return model, Vocab(path)


def make(loaded, cache, slots=2, **kw):
    from mlxcel_trio.engine.scheduler import Scheduler

    model, vocab = loaded
    return Scheduler(model, vocab, n_slots=slots, n_ctx_slot=1024, batch_size=32,
                     prompt_cache=cache, **kw)


def job(i, prompt, **kw):
    kw.setdefault("n_predict", 8)
    return Job(i, tuple(prompt), sampling=GREEDY, ignore_eos=True, cache_ns="raw", **kw)


def one(s, j):
    out = []
    s.submit(j, out)
    run(s, out)
    (fin,) = of(out, Finished, j.id)
    return fin


def test_follow_up_restarts_from_a_snapshot_and_equals_cold(loaded):
    cold = one(make(loaded, None), job(1, BASE + (7, 8, 9, 10)))
    cache = PromptCache(None)
    s = make(loaded, cache)
    first = one(s, job(2, BASE))
    assert first.timings.cache_n == 0
    # the snapshot at the end of BASE's prefill (len - 1) and the final state
    # after generation are both stored
    assert len(cache) >= 1
    hit = one(s, job(3, BASE + (7, 8, 9, 10)))
    assert hit.timings.cache_n >= len(BASE) - 1
    assert hit.tokens == cold.tokens


def test_a_diverging_prompt_uses_a_shorter_snapshot_or_none(loaded):
    prompt = BASE[:50] + (999, 998) + BASE[50:]
    cold = one(make(loaded, None), job(1, prompt))
    s = make(loaded, PromptCache(None))
    one(s, job(2, BASE))
    hit = one(s, job(3, prompt))
    # nothing past the divergence point is reused
    assert hit.timings.cache_n <= 50
    assert hit.tokens == cold.tokens


def test_concurrent_rows_snapshot_and_reuse(loaded):
    cold = [one(make(loaded, None), job(1, BASE[:k] + (5, 6))) for k in (60, 90)]
    cache = PromptCache(None)
    s = make(loaded, cache)
    out = []
    s.submit(job(2, BASE[:60]), out)
    s.submit(job(3, BASE[:90]), out)
    run(s, out)
    out = []
    s.submit(job(4, BASE[:60] + (5, 6)), out)
    s.submit(job(5, BASE[:90] + (5, 6)), out)
    run(s, out)
    got = [of(out, Finished, i)[0] for i in (4, 5)]
    assert [f.tokens for f in got] == [c.tokens for c in cold]
    assert all(f.timings.cache_n > 0 for f in got)

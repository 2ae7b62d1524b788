"""Where the engine's features meet: slot restore x prompt cache x the slot
bound, sleep x the prompt cache's reported state, internal jobs x /metrics.

White-box: makes the scheduler's private `_Sequence` throw and fills its `_pending`."""

from __future__ import annotations

import pytest

from mlxcel_trio.engine.prompt_cache import PromptCache
from mlxcel_trio.protocol.records import (
    Finished,
    Job,
    SamplingParams,
    SlotAction,
    SlotFreed,
    SlotTokens,
    Started,
)

from .test_scheduler import of, run

GREEDY = SamplingParams(temperature=0.0)
N_CTX = 64


@pytest.fixture(scope="module")
def loaded(tiny_model):
    from mlx_lm.utils import load_model

    from mlxcel_trio.engine.vocab import Vocab

    model, _ = load_model(tiny_model)
    return model, Vocab(tiny_model)


def make(loaded, cache, slots=1, **kw):
    from mlxcel_trio.engine.scheduler import Scheduler

    model, vocab = loaded
    return Scheduler(model, vocab, n_slots=slots, n_ctx_slot=N_CTX, batch_size=32,
                     prompt_cache=cache, **kw)


def test_restoring_a_stream_that_filled_its_slot_refills_without_failing(loaded):
    """A truncated generation saves exactly n_ctx_slot tokens; restoring that
    file with the prompt cache on must not leave the engine stuck (the refill
    used to be inserted with max_tokens 0, which mlx-lm rejects by raising
    out of the command, killing the engine thread)."""
    cache = PromptCache(None)
    s, out = make(loaded, cache), []
    prompt = tuple(range(40, 40 + N_CTX - 8))
    s.submit(Job(1, prompt, -1, sampling=GREEDY, ignore_eos=True, cache_ns="raw"), out)
    run(s, out)
    (fin,) = of(out, Finished, 1)
    assert fin.truncated
    s.slot_action(SlotAction(10, 0), out)
    saved = of(out, SlotTokens, 10)[0].tokens
    assert len(saved) == N_CTX

    s2, out2 = make(loaded, PromptCache(None)), []
    s2.slot_action(SlotAction(11, 0, saved, "raw"), out2)
    run(s2, out2)
    assert of(out2, SlotFreed) and not s2.busy and s2._free == [0]
    # the slot keeps the whole restored stream; the cache holds all it can use
    s2.slot_action(SlotAction(12, 0), out2)
    assert of(out2, SlotTokens, 12)[0].tokens == saved
    s2.submit(Job(2, saved[:N_CTX - 1], n_predict=1, sampling=GREEDY, cache_ns="raw"), out2)
    run(s2, out2)
    assert of(out2, Started, 2)[0].n_cache == N_CTX - 2


def test_a_start_that_throws_before_registering_leaks_no_slot_and_no_waiting_job(loaded, monkeypatch):
    """If starting a job fails before the job is registered, its slot goes
    back to the free list and jobs skipped for a pinned slot stay queued, so
    the engine loop's failure path leaves nothing behind."""
    from mlxcel_trio.engine import scheduler as sched

    s, out = make(loaded, None, slots=2), []
    s.submit(Job(1, (5, 6, 7), n_predict=50, sampling=GREEDY, id_slot=0), out)
    real = sched._Sequence.__init__

    def boom(self, job, *a, **kw):
        if job.id == 3:
            raise RuntimeError("injected")
        real(self, job, *a, **kw)

    monkeypatch.setattr(sched._Sequence, "__init__", boom)
    s._pending.extend([Job(2, (5, 6), n_predict=1, sampling=GREEDY, id_slot=0),
                       Job(3, (5, 6), n_predict=1, sampling=GREEDY)])
    with pytest.raises(RuntimeError, match="injected"):
        s._admit(out)
    assert s._free == [1], "the slot taken for the failed start leaked"
    assert [j.id for j in s._pending] == [2], "the job waiting for its pinned slot was lost"
    monkeypatch.setattr(sched._Sequence, "__init__", real)
    run(s, out)
    assert {f.job_id for f in of(out, Finished)} == {1, 2}

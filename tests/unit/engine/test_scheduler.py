"""The scheduler driven directly, step by step (no threads, no HTTP).

White-box where a fault is injected into the scheduler's own steps (`_start`).
"""

from __future__ import annotations

import pytest

from mlxcel_trio.protocol.records import (
    Failed,
    Finished,
    Job,
    SamplingParams,
    SlotFreed,
    Started,
    TokenPiece,
)

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def loaded(tiny_model):
    from mlx_lm.utils import load_model

    from mlxcel_trio.engine.vocab import Vocab

    model, _ = load_model(tiny_model)
    return model, Vocab(tiny_model)


def make(loaded, slots=2, n_ctx_slot=256):
    from mlxcel_trio.engine.scheduler import Scheduler

    model, vocab = loaded
    return Scheduler(model, vocab, n_slots=slots, n_ctx_slot=n_ctx_slot, batch_size=64)


def job(i, prompt=(5, 6, 7), **kw):
    kw.setdefault("n_predict", 8)
    kw.setdefault("sampling", GREEDY)
    kw.setdefault("ignore_eos", True)
    return Job(i, tuple(prompt), **kw)


def run(s, out, limit=2000):
    for _ in range(limit):
        if not s.busy:
            return out
        s.step(out)
    raise AssertionError("scheduler did not drain")


def of(out, kind, job_id=None):
    return [e for e in out if isinstance(e, kind) and (job_id is None or e.job_id == job_id)]


def test_limit_and_content(loaded):
    s, out = make(loaded), []
    s.submit(job(1, n_predict=5), out)
    run(s, out)
    (fin,) = of(out, Finished)
    assert fin.stop_type == "limit" and len(fin.tokens) == 5 and not fin.truncated
    assert "".join(p.text for p in of(out, TokenPiece)) == fin.content
    assert of(out, SlotFreed)[0].cancelled is False


def test_context_bound_truncates(loaded):
    s, out = make(loaded, n_ctx_slot=20), []
    s.submit(job(1, prompt=[5] * 15, n_predict=-1), out)
    run(s, out)
    (fin,) = of(out, Finished)
    assert len(fin.tokens) == 5 and fin.truncated and fin.stop_type == "limit"


def test_prompt_too_long_fails_at_admission(loaded):
    s, out = make(loaded, n_ctx_slot=20), []
    s.submit(job(1, prompt=[5] * 20), out)
    (f,) = of(out, Failed)
    assert f.code == "exceeds_context" and dict(f.extra) == {"n_prompt_tokens": 20, "n_ctx": 20}
    assert not s.busy


def test_jobs_wait_for_a_free_slot_and_cancel_admits_the_next(loaded):
    s, out = make(loaded, slots=1), []
    s.submit(job(1, n_predict=1000), out)
    s.submit(job(2, n_predict=3), out)
    s.step(out)
    assert [e.job_id for e in of(out, Started)] == [1]
    s.cancel(1, out)
    assert of(out, SlotFreed, 1)[0].cancelled is True
    assert [e.job_id for e in of(out, Started)] == [1, 2]
    run(s, out)
    assert len(of(out, Finished, 2)[0].tokens) == 3
    assert not of(out, Finished, 1)


def test_cancel_of_a_queued_job_never_starts_it(loaded):
    s, out = make(loaded, slots=1), []
    s.submit(job(1, n_predict=4), out)
    s.submit(job(2), out)
    s.cancel(2, out)
    run(s, out)
    assert not of(out, Started, 2)


def test_id_slot(loaded):
    s, out = make(loaded, slots=2), []
    s.submit(job(1, id_slot=1), out)
    assert of(out, Started, 1)[0].id_slot == 1
    s.submit(job(2, id_slot=5), out)
    assert of(out, Failed, 2)[0].code == "invalid_slot"


def test_stop_word(loaded):
    s, out = make(loaded), []
    s.submit(job(1, n_predict=40), out)
    run(s, out)
    text = of(out, Finished, 1)[0].content
    stop = text[10:13]
    s2, out2 = make(loaded), []
    s2.submit(job(2, n_predict=40, stop=(stop,)), out2)
    run(s2, out2)
    fin = of(out2, Finished, 2)[0]
    assert fin.stop_type == "word" and fin.stopping_word == stop
    assert fin.content == text[: text.index(stop)]


def test_a_failed_step_fails_jobs_not_the_scheduler(loaded, monkeypatch):
    s, out = make(loaded, slots=1), []
    s.submit(job(1, n_predict=50), out)
    s.submit(job(2, n_predict=3), out)
    s.step(out)

    def boom():
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(s._gen, "next", boom)
    with pytest.raises(RuntimeError):
        s.step(out)
    s.fail_all(out, "RuntimeError: kernel exploded")
    assert of(out, Failed, 1)[0].kind == "server_error"
    run(s, out)  # the queued job runs on the fresh generator
    assert len(of(out, Finished, 2)[0].tokens) == 3


def test_greedy_ignore_eos_bans_eos_in_a_shared_sampler_not_a_processor(loaded, tiny_facts):
    """A processor on any row makes mlx-lm process the whole batch row by
    row; a plain greedy ignore_eos job needs none.  It still never draws
    EOS: the fixture's EOS prompt, which greedy decoding ends after k
    tokens, runs past k."""
    from mlxcel_trio.engine.sampling import GREEDY as SHARED_GREEDY

    s = make(loaded)
    sampler, processors, _ = s._sampling_plan(job(1))
    assert processors == [] and sampler is not SHARED_GREEDY
    assert s._sampling_plan(job(2))[0] is sampler          # one sampler for every such row
    biased = job(3, sampling=SamplingParams(temperature=0.0, logit_bias=((5, 1.0),)))
    assert s._sampling_plan(biased)[1]                     # other processing keeps its processor
    vocab = loaded[1]
    prompt = vocab.tokenize(tiny_facts["eos_prompt"])
    k = tiny_facts["eos_after_tokens"]
    out = []
    s.submit(job(4, prompt, n_predict=k + 8), out)
    run(s, out)
    (fin,) = of(out, Finished)
    tokens = [p.token for p in of(out, TokenPiece)]
    assert len(tokens) == k + 8 and not set(tokens) & set(vocab.eos_ids), fin


def test_a_queued_job_whose_start_raises_is_answered_and_the_rest_are_served(loaded,
                                                                           monkeypatch):
    """A job taken off the queue whose start raises before it is registered
    is in no table afterwards: it must be answered (a server error) where
    it raised, or its request waits forever.  White-box: `_start` made to
    raise for chosen jobs."""
    from mlxcel_trio.engine.scheduler import Scheduler

    real_start = Scheduler._start

    def start(self, job, slot, out):
        if job.id in (2, 3):
            raise RuntimeError(f"injected {job.id}")
        return real_start(self, job, slot, out)

    monkeypatch.setattr(Scheduler, "_start", start)
    s, out = make(loaded, slots=1), []
    s.submit(job(1, n_predict=50), out)
    s.submit(job(2), out)   # queued behind job 1
    s.submit(job(3), out)
    s.step(out)
    with pytest.raises(RuntimeError, match="injected 2"):
        s.cancel(1, out)   # frees the slot: job 2 is started, and raises
    assert [f.message for f in of(out, Failed, 2)] == ["RuntimeError: injected 2"]
    # the engine loop's handler for a failed command: job 3's start raises
    # inside it, and it must neither raise nor drop job 3
    s.fail_all(out, "RuntimeError: injected 2")
    assert [f.message for f in of(out, Failed, 3)] == ["RuntimeError: injected 3"]
    assert not s.busy and s._free == [0], "no job queued or admitted, the slot free"
    s.submit(job(4, n_predict=3), out)
    run(s, out)
    assert len(of(out, Finished, 4)[0].tokens) == 3

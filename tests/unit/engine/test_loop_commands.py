"""The engine loop's commands: one that throws fails its own job, not the
engine (as a failed step does), and later ones are served; a ForceEnd
reaches the running job's constraint before its next draw; the loop's
counters leave with the steps' events (EngineStats), MLX's allocator
figures whenever it goes idle (MlxMemory), after a memory release.

White-box: replaces the scheduler's private `_sampling_plan` (and `_start`)
to make a step throw."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from mlxcel_trio.engine.loop import EngineLoop
from mlxcel_trio.engine.spec import EngineSpec
from mlxcel_trio.protocol.records import (
    EngineStats,
    Failed,
    Finished,
    ForceEnd,
    Job,
    Loaded,
    MlxMemory,
    SamplingParams,
    Shutdown,
    SlotAction,
    SlotFreed,
    Submit,
    TokenPiece,
)
from mlxcel_trio.engine.scheduler import Scheduler

WAIT_S = 60
GREEDY = SamplingParams(temperature=0.0)


class _Events:
    """The engine's events as its emit callback delivers them, read with a
    bounded wait that names what never came."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()

    def emit(self, batch) -> None:
        for ev in batch.events:
            self._queue.put(ev)

    def until(self, pred, timeout: float = WAIT_S) -> list:
        """Every event up to and including the first matching `pred`."""
        seen: list = []
        while True:
            try:
                ev = self._queue.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no matching engine event within {timeout} s; "
                                     f"saw {seen[-5:]}") from None
            seen.append(ev)
            if pred(ev):
                return seen


@contextmanager
def running(model, events: _Events, **spec) -> Iterator[EngineLoop]:
    """An engine on its own thread, loaded; shut down and joined after."""
    engine = EngineLoop(EngineSpec(str(model), batch_size=64, warmup=False, **spec), events.emit)
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    try:
        events.until(lambda ev: isinstance(ev, Loaded))
        yield engine
    finally:
        engine.post(Shutdown())
        thread.join(WAIT_S)
    assert not thread.is_alive()


def test_a_throwing_command_fails_its_job_not_the_engine(tiny_model, monkeypatch):
    real_plan = Scheduler._sampling_plan

    def plan(self, job):   # fails after the job took its slot and was Started
        if job.id == 2:
            raise RuntimeError("injected")
        return real_plan(self, job)

    def slot_action(self, cmd, out):
        raise RuntimeError("injected")

    monkeypatch.setattr(Scheduler, "_sampling_plan", plan)
    monkeypatch.setattr(Scheduler, "slot_action", slot_action)
    events = _Events()
    until = events.until
    with running(tiny_model, events, n_slots=1, ctx_size=256) as engine:
        engine.post(Submit(Job(2, (5, 6, 7), n_predict=4, sampling=GREEDY)))
        seen = until(lambda ev: isinstance(ev, SlotFreed) and ev.job_id == 2)
        assert [ev.message for ev in seen if isinstance(ev, Failed)] == [
            "RuntimeError: injected"]
        engine.post(SlotAction(3, 0))
        failed = until(lambda ev: isinstance(ev, Failed))[-1]  # after the idle MlxMemory
        assert failed.job_id == 3 and failed.kind == "server_error"
        engine.post(Submit(Job(4, (5, 6, 7), n_predict=4, sampling=GREEDY, ignore_eos=True)))
        done = until(lambda ev: isinstance(ev, Finished))[-1]
        assert done.job_id == 4 and len(done.tokens) == 4, "the slot was freed and reused"


def test_a_queued_job_whose_start_raises_after_a_step_is_answered(tiny_model, monkeypatch):
    """A job waiting for the one slot is started when a step frees it; a
    start that raises before the job is registered used to leave it in no
    table, unanswered: its request waited forever."""
    real_start = Scheduler._start

    def start(self, job, slot, out):
        if job.id == 3:
            raise RuntimeError("injected")
        return real_start(self, job, slot, out)

    monkeypatch.setattr(Scheduler, "_start", start)
    events = _Events()
    until = events.until
    with running(tiny_model, events, n_slots=1, ctx_size=256) as engine:
        engine.post(Submit(Job(2, (5, 6, 7), n_predict=8, sampling=GREEDY, ignore_eos=True)))
        engine.post(Submit(Job(3, (5, 6, 7), n_predict=4, sampling=GREEDY)))  # queued
        # job 2 finishes in a step, which then starts job 3
        seen = until(lambda ev: getattr(ev, "job_id", None) == 3, timeout=20)
        assert isinstance(seen[-1], Failed) and seen[-1].kind == "server_error"
        assert seen[-1].message == "RuntimeError: injected"
        assert [ev.job_id for ev in seen if isinstance(ev, Finished)] == [2]
        engine.post(Submit(Job(4, (5, 6, 7), n_predict=4, sampling=GREEDY, ignore_eos=True)))
        done = until(lambda ev: isinstance(ev, Finished))[-1]
        assert done.job_id == 4 and len(done.tokens) == 4, "the slot was freed and reused"


class _Switch:
    """A constraint that bans end-of-generation until force_end(), then
    allows nothing else: the job can only end by the forced close."""

    def __init__(self, n_vocab: int, eos: int) -> None:
        self.free = np.ones((1, n_vocab), dtype=bool)
        self.free[0, eos] = False
        self.end = ~self.free
        self.calls = 0

    def start(self, n_prompt: int) -> "_Switch":
        return self

    def mask_for(self, history):
        return self.end if self.calls else self.free

    def force_end(self) -> None:
        self.calls += 1


def test_force_end_reaches_the_running_jobs_constraint_and_stats_follow_the_steps(tiny_model):
    events = _Events()
    until = events.until
    with running(tiny_model, events, n_slots=1, ctx_size=512) as engine:
        vocab = engine.vocab
        switch = _Switch(vocab.n_vocab, min(vocab.eos_ids))
        engine.post(Submit(Job(5, (5, 6, 7), n_predict=-1, sampling=GREEDY, grammar=switch)))
        seen = until(lambda ev: isinstance(ev, TokenPiece))
        engine.post(ForceEnd((5, 99)))   # 99: no such job, ignored
        seen += until(lambda ev: isinstance(ev, SlotFreed))
        seen += until(lambda ev: isinstance(ev, EngineStats))  # closes the same batch
        (fin,) = [ev for ev in seen if isinstance(ev, Finished)]
        assert switch.calls == 1
        assert fin.stop_type == "eos" and fin.tokens[-1] in vocab.eos_ids
        assert len(fin.tokens) < 512 - 3, "closed by the command, not by the context bound"
        stats = [ev for ev in seen if isinstance(ev, EngineStats)]
        assert [s.n_decode for s in stats] == list(range(1, len(stats) + 1))
        assert stats[-1] == EngineStats(engine.n_decode, engine.n_busy_slots)
        assert stats[-1].n_busy_slots == stats[-1].n_decode   # one slot, busy every step


def test_a_burst_reaching_an_idle_engine_is_prefilled_together(tiny_model, monkeypatch):
    """Jobs arriving at an idle engine a little apart are admitted before its
    first step, so they share one prefill instead of the first going alone.
    The window is widened here so the staggered arrivals (the workload's
    shape, 30 ms apart) fall well inside it on a busy machine."""
    from mlxcel_trio.engine import loop
    from mlxcel_trio.protocol.records import Started

    monkeypatch.setattr(loop, "BURST_GAP_S", 0.5)
    monkeypatch.setattr(loop, "BURST_MAX_S", 5.0)
    events = _Events()
    with running(tiny_model, events, n_slots=4, ctx_size=1024) as engine:
        pause = threading.Event()
        for i in range(1, 5):
            engine.post(Submit(Job(i, (5, 6, 7, i), n_predict=4, sampling=GREEDY)))
            pause.wait(0.03)   # staggered arrivals, as requests parsed one by one
        seen = events.until(lambda ev: isinstance(ev, Started) and ev.job_id == 4)
        assert not [ev for ev in seen if isinstance(ev, TokenPiece)], \
            "a job decoded before the rest of the burst was admitted"
        done: set[int] = set()
        events.until(lambda ev: isinstance(ev, Finished) and (done.add(ev.job_id) or
                                                                len(done) == 4))


def test_the_engine_releases_memory_and_reports_it_each_time_it_goes_idle(tiny_model):
    events = _Events()
    until = events.until
    with running(tiny_model, events, n_slots=1, ctx_size=256) as engine:
        loaded = until(lambda ev: isinstance(ev, MlxMemory))[-1]   # idle once loaded
        assert 0 < loaded.active <= loaded.peak, "the weights are live arrays"
        engine.post(Submit(Job(2, (5, 6, 7), n_predict=4, sampling=GREEDY, ignore_eos=True)))
        seen = until(lambda ev: isinstance(ev, SlotFreed))
        seen += until(lambda ev: isinstance(ev, MlxMemory))
        after = seen[-1]
        assert after.peak >= max(after.active, loaded.peak)
        assert after != loaded, "the job's arrays moved the figures"
        # each idle start released memory (engine/memory_release.py) first
        assert loaded.releases >= 1 and after.releases > loaded.releases
        assert after.release_seconds > loaded.release_seconds

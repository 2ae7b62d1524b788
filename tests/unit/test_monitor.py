"""The slot registry and counters (monitor.py), fed events by hand."""

from __future__ import annotations

import attrs
import pytest

from mlxcel_trio.protocol.records import (
    Failed, Finished, Job, Sleeping, SlotFreed, Started, Timings, TokenPiece, Woke,
)
from mlxcel_trio.monitor import Monitor, slots_debug


def piece(job_id, n, text="a", prompt_n=3, prompt_ms=30.0, predicted_ms=0.0):
    return TokenPiece(job_id, 7, text, n, True, False,
                      Timings(0, prompt_n, prompt_ms, n, predicted_ms))


def test_a_job_through_its_slot():
    m = Monitor(2)
    job = Job(1, (1, 2, 3), n_predict=10)
    m.submitted(job)
    assert len(m.queued) == 1 and m.n_processing == 0
    m.observe(Started(1, 0, 3, 0))
    assert not m.queued and m.n_processing == 1 and m.slots[0].job is job
    m.observe(piece(1, 1))
    assert m.counters.prompt.count == 3 and m.slots[0].n_processed == 3
    m.observe(piece(1, 2, "x\ny", predicted_ms=10.0))
    m.observe(piece(1, 3, "z", predicted_ms=20.0))
    view = m.slots[0]
    assert view.has_new_line and view.n_decoded == 3 and view.n_remain == 7
    m.observe(Finished(1, 0, "ax\nyz", (7, 7, 7), "limit", "", False, 3,
                       Timings(0, 3, 30.0, 3, 20.0)))
    m.observe(SlotFreed(0, 1, False))
    assert m.n_processing == 0 and view.job_id == 1, "the idle slot keeps its last task"
    assert (view.n_decoded, view.n_remain, view.n_processed, view.has_new_line) == \
        (0, -1, 0, False), "but not its counters (upstream's reset on release)"
    c = m.counters
    assert (c.predict.count, c.predict.steps) == (3, 2), "the first token is free"
    assert c.predict.seconds == pytest.approx(0.02)
    assert m.n_tokens_max() == 6 and c.finished == 1
    assert m.take_windows() == (pytest.approx(100.0), pytest.approx(100.0))
    assert m.take_windows() == (0.0, 0.0), "each read starts a new window"


def test_cancelled_and_failed_jobs():
    m = Monitor(1)
    m.submitted(Job(1, (1,), n_predict=-1))
    m.submitted(Job(2, (1,), n_predict=-1))
    m.observe(Started(1, 0, 1, 0))
    m.observe(piece(1, 1, prompt_n=1))
    m.observe(piece(1, 2, prompt_n=1, predicted_ms=5.0))
    assert m.slots[0].n_remain == -1
    m.observe(SlotFreed(0, 1, True))
    assert m.counters.cancelled == 1 and m.counters.predict.count == 2
    m.dropped(2)  # the waiting request went away before admission
    assert not m.queued
    m.submitted(Job(3, (1,), n_predict=-1))
    m.observe(Failed(3, "invalid_request_error", "x"))  # refused before admission
    assert m.counters.failed == 1 and not m.queued


def test_sleep_events():
    m = Monitor(1)
    m.observe(Sleeping(1024))
    assert m.sleeping and m.counters.released_bytes == 1024
    m.observe(Woke(250.0))
    assert not m.sleeping and m.counters.wake_seconds == pytest.approx(0.25)


@pytest.mark.parametrize("value, on", [
    ("", False), ("0", False), ("1", True), ("2x", True), ("abc", False), (" -3", True),
])
def test_slots_debug_reads_like_atoi(monkeypatch, value, on):
    monkeypatch.setenv("LLAMA_SERVER_SLOTS_DEBUG", value)
    assert slots_debug() is on


def test_a_restore_refill_is_no_request():
    """A slot restore with the prompt cache on re-evaluates the tokens as an
    internal job (negative id, engine/scheduler.py _refill): the slot shows
    busy meanwhile, but the refill is no request and keeps the slot's last
    task; a failed slot action is no generation job either."""
    m = Monitor(1)
    job = Job(1, (1, 2, 3), n_predict=2)
    m.submitted(job)
    m.observe(Started(1, 0, 3, 0))
    m.observe(piece(1, 1))
    m.observe(Finished(1, 0, "a", (7,), "limit", "", False, 3, Timings(0, 3, 30.0, 1, 0.0)))
    m.observe(SlotFreed(0, 1, False))
    before = attrs.asdict(m.counters)
    m.observe(Started(-1001, 0, 50, 0))
    assert m.n_processing == 1, "the slot is busy while it refills"
    m.observe(piece(-1001, 1, prompt_n=50))
    m.observe(Finished(-1001, 0, "", (7,), "limit", "", True, 50, Timings(0, 50, 9.0, 1, 0.0)))
    m.observe(SlotFreed(0, -1001, False))
    m.observe(Failed(5, "unavailable_error", "slot 0 is processing a task"))
    view = m.slots[0]
    assert m.n_processing == 0 and view.job_id == 1 and view.job is job
    assert attrs.asdict(m.counters) == before
    assert m.n_tokens_max() == 4

"""server/sessions/detached.py: the one nursery for work that outlives its
request, driven with trio's MockClock and wait_all_tasks_blocked."""

from __future__ import annotations

import contextvars

import pytest
import trio
import trio.testing

from mlxcel_trio.server.http.resources import RequestResources
from mlxcel_trio.server.sessions.detached import Detached, NotRunning


class _Handle:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


async def test_start_before_run_is_refused_and_takes_nothing():
    detached, res, h = Detached(), RequestResources(), _Handle()
    res.own(h)

    async def work() -> None:
        pass

    with pytest.raises(NotRunning):
        detached.start(work, moving=(h,), source=res)
    res.close()
    assert h.closed == 1                 # still the request's


async def test_moved_resources_outlive_the_request_and_close_with_the_task():
    done = trio.Event()
    async with trio.open_nursery() as n:
        detached = Detached()
        await n.start(detached.run)
        res, h = RequestResources(), _Handle()
        res.own(h)
        detached.start(done.wait, moving=(h,), source=res)
        res.close()                      # the request ends
        await trio.testing.wait_all_tasks_blocked()
        assert h.closed == 0             # the task owns it now
        done.set()
        await trio.testing.wait_all_tasks_blocked()
        assert h.closed == 1
        n.cancel_scope.cancel()
    assert not detached.running


async def test_shutdown_cancels_tasks_and_closes_what_they_own():
    h = _Handle()
    async with trio.open_nursery() as n:
        detached = Detached()
        await n.start(detached.run)
        detached.start(trio.sleep_forever, moving=(h,))
        await trio.testing.wait_all_tasks_blocked()
        n.cancel_scope.cancel()
    assert h.closed == 1
    with pytest.raises(NotRunning):
        detached.start(trio.sleep_forever)


async def test_a_failing_task_ends_alone(autojump_clock):
    h, other_done = _Handle(), trio.Event()

    async def broken() -> None:
        raise ValueError("a bug")

    async def other() -> None:
        await trio.sleep(1)
        other_done.set()

    async with trio.open_nursery() as n:
        detached = Detached()
        await n.start(detached.run)
        detached.start(broken, moving=(h,))
        detached.start(other)
        await other_done.wait()
        assert h.closed == 1 and detached.running
        n.cancel_scope.cancel()


async def test_tasks_run_in_the_server_context_not_the_requests():
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="server")
    seen: list[str] = []

    async def work() -> None:
        seen.append(var.get())

    async with trio.open_nursery() as n:
        detached = Detached()
        await n.start(detached.run)
        var.set("request")               # what a request task would have set
        detached.start(work)
        await trio.testing.wait_all_tasks_blocked()
        n.cancel_scope.cancel()
    assert seen == ["server"]

"""One nursery for work that outlives the request that started it.

Theory of operation.  `Detached.run` is a task of the runner's root nursery
(server/runner.py) and holds the one nursery every detached task runs in: a
stream session's producer (sessions/streams.py) and a background Responses
run (surfaces/responses.py).  `start` moves resources from the request to
the task: each is taken off the request's `RequestResources` (so the
request's end no longer closes it) and closed by the task when it ends,
however it ends.  A task that must be stoppable from outside (DELETE
/v1/stream, POST /v1/responses/:id/cancel) brings its own cancel scope.

Tasks start in the context `run` was started in (the server's), never the
request's: a detached task that reached for the request (Quart's `request`,
`g`) would read one that has ended, so it finds none instead.

Shutdown cancels the nursery with the root scope; each task's own `finally`
then closes what it owns (a job handle posts its `Cancel`).
"""

from __future__ import annotations

import contextvars
import logging
from typing import Awaitable, Callable, Iterable

import trio

from ..http.resources import Closeable, RequestResources

log = logging.getLogger("mlxcel.detached")


class NotRunning(RuntimeError):
    """`start` before `run` started, or after it ended (shutdown)."""


class Detached:
    def __init__(self) -> None:
        self._nursery: trio.Nursery | None = None   # set while run() runs
        self._context: contextvars.Context | None = None

    @property
    def running(self) -> bool:
        return self._nursery is not None

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._context = contextvars.copy_context()
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = self._context = None

    def start(self, fn: Callable[..., Awaitable[None]], *args,
              moving: Iterable[Closeable] = (), source: RequestResources | None = None,
              name: str | None = None) -> None:
        """Run `fn(*args)` in the detached nursery; every resource in
        `moving` is taken off `source` (the request) and closed when the
        task ends.  Raises NotRunning, without taking anything, when the
        nursery is not running."""
        if self._nursery is None or self._context is None:
            raise NotRunning("detached work is not running")
        owned = tuple(moving)
        if source is not None:
            for resource in owned:
                source.detach(resource)
        self._context.run(self._nursery.start_soon, self._owned, fn, args, owned,
                          name=name or getattr(fn, "__qualname__", None))

    @staticmethod
    async def _owned(fn: Callable[..., Awaitable[None]], args: tuple,
                     owned: tuple[Closeable, ...]) -> None:
        try:
            await fn(*args)
        except Exception:  # one task's bug ends that task, never the nursery
            log.exception("detached task %r failed", fn)
        finally:
            for resource in owned:
                resource.close()

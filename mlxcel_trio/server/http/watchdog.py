"""The request watchdog: a request that stops making progress is reported once.

Progress is anything that shows a request is moving: a message of its body
arriving, a byte of its response written (an SSE ping counts), or an engine
event for one of its jobs (a prompt chunk processed, a token decoded, the
job admitted or ended).  A job still queued in the engine while the engine
steps for others is waiting its turn, which counts too.  A request with none
of these for longer than the bound is logged once, with the await stack of
its trio task and the tasks under it, and counted in /metrics
(`mlxcel_requests_stalled_total`; `mlxcel_requests_stalled` while it lasts).
The watchdog never ends a request: --timeout keeps its meaning (a write or a
body read that takes too long), and a stalled request may still finish.

Nothing is added on the engine's per-token path: the engine side of a
request's progress is read from the bridge's monitor (its slot views and
queue) when the watchdog looks, once per tick.  The request's job ids reach
the watchdog through `monitor.REQUEST`, a context variable the ASGI wrapper
sets for the request's task; `Monitor.submitted` appends to it.

The bound is WATCHDOG_S, or the internal environment variable WATCHDOG_ENV
(seconds; 0 turns the watchdog off), which tests use to shorten it; it is
not an option.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from typing import Iterator

import trio

from ...monitor import REQUEST, Monitor

log = logging.getLogger("mlxcel.watchdog")

WATCHDOG_S = 60.0
WATCHDOG_ENV = "MLXCEL_REQUEST_WATCHDOG_S"
STACK_LINES = 80   # a stalled request's logged stack, at most


class Tracked:
    """One request under watch.  `marks` counts its own progress (body
    messages, response messages); `job_ids` are its engine jobs."""

    __slots__ = ("method", "path", "task", "started", "marks", "job_ids", "seen", "since",
                 "stalled")

    def __init__(self, method: str, path: str, task, now: float) -> None:
        self.method, self.path, self.task = method, path, task
        self.started = now
        self.marks = 0
        self.job_ids: list[int] = []
        self.seen: object = None     # the progress signature at the last tick
        self.since = now             # when it last changed
        self.stalled = False

    def mark(self) -> None:
        self.marks += 1


def bound_from_env() -> float:
    raw = os.environ.get(WATCHDOG_ENV)
    return float(raw) if raw else WATCHDOG_S


def task_stack(task, depth: int = 0, lines: list[str] | None = None) -> list[str]:
    """`task`'s await frames and its children's, innermost await last
    (trio's own frames left out)."""
    lines = [] if lines is None else lines
    lines.append(f"{'  ' * depth}- {task.name}")
    for frame, lineno in task.iter_await_frames():
        if "/trio/_core/" not in frame.f_code.co_filename:
            lines.append(f"{'  ' * depth}    {frame.f_code.co_filename}:{lineno} in "
                         f"{frame.f_code.co_name}")
    for nursery in task.child_nurseries:
        for child in nursery.child_tasks:
            task_stack(child, depth + 1, lines)
    return lines


class RequestWatchdog:
    def __init__(self, monitor: Monitor, bound_s: float | None = None) -> None:
        self.monitor = monitor
        self.bound_s = bound_from_env() if bound_s is None else bound_s
        self.stalled_total = 0
        self._live: set[Tracked] = set()

    @property
    def on(self) -> bool:
        return self.bound_s > 0

    @property
    def stalled_now(self) -> int:
        return sum(1 for t in self._live if t.stalled)

    @contextmanager
    def track(self, method: str, path: str) -> Iterator[Tracked | None]:
        """Watch the request running in the current task for as long as the
        block runs (None when the watchdog is off)."""
        if not self.on:
            yield None
            return
        tracked = Tracked(method, path, trio.lowlevel.current_task(), time.monotonic())
        token = REQUEST.set(tracked)
        self._live.add(tracked)
        try:
            yield tracked
        finally:
            self._live.discard(tracked)
            REQUEST.reset(token)

    def _signature(self, t: Tracked) -> tuple:
        monitor = self.monitor
        engine = tuple(monitor.job_progress(job_id) for job_id in t.job_ids)
        # a job queued while the engine steps for others is waiting its turn
        waiting = any(job_id in monitor.queued for job_id in t.job_ids)
        return t.marks, engine, monitor.counters.n_decode if waiting else None

    def check(self, now: float | None = None) -> list[Tracked]:
        """One tick: the requests found stalled for the first time."""
        now = time.monotonic() if now is None else now
        found = []
        for t in list(self._live):
            sig = self._signature(t)
            if sig != t.seen:
                t.seen, t.since, t.stalled = sig, now, False
            elif not t.stalled and now - t.since > self.bound_s:
                t.stalled = True
                self.stalled_total += 1
                found.append(t)
                self._report(t, now)
        return found

    def _report(self, t: Tracked, now: float) -> None:
        stack = task_stack(t.task)
        if len(stack) > STACK_LINES:
            stack = stack[:STACK_LINES] + [f"... {len(stack) - STACK_LINES} more lines"]
        log.warning("request %s %s: no progress for %.1f s (no engine event, no byte written; "
                    "running %.1f s, jobs %s); its tasks, innermost await last:\n%s",
                    t.method, t.path, now - t.since, now - t.started, t.job_ids or "none",
                    "\n".join(stack))

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if not self.on:
            return
        tick = max(0.05, min(1.0, self.bound_s / 4))
        while True:
            await trio.sleep(tick)
            self.check()

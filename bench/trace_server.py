"""Run `mlxcel-server` with timestamped trace points (a diagnostic, not a test).

    MLXCEL_BENCH_TRACE=/tmp/trace.log python bench/trace_server.py -m DIR ...

Same arguments as `mlxcel-server`.  Wraps, without changing behaviour, the
points a request crosses on its way through the engine and writes one line
per crossing: `<time.perf_counter()> <thread> <event> <detail>`.
perf_counter is CLOCK_MONOTONIC on Linux, so client-side timestamps taken in
another process on the same machine line up with these.

Trace points: HTTP disconnect seen by the ASGI app, job handle closed
(Cancel posted), engine commands received, Scheduler.step / BatchGenerator.next
duration, Scheduler.cancel, StepEvents delivered to trio (SlotFreed,
TokenPiece counts).  bench/throughput.py --trace uses it for the disconnect
measurement.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_OUT = open(os.environ.get("MLXCEL_BENCH_TRACE", "/dev/stderr"), "a", buffering=1)
_LOCK = threading.Lock()


def trace(event: str, detail: str = "") -> None:
    line = f"{time.perf_counter():.6f} {threading.current_thread().name} {event} {detail}\n"
    with _LOCK:
        _OUT.write(line)


def _wrap(cls, name, before=None, after=None):
    orig = getattr(cls, name, None)
    if orig is None:  # the server moved on; this trace point is simply absent
        trace("trace.missing", f"{cls.__name__}.{name}")
        return

    def safe(hook, a, kw):
        try:  # a trace point must never change what the server does
            hook(*a, **kw)
        except Exception as exc:
            trace("trace.error", f"{name}: {exc!r}")

    def wrapper(*a, **kw):
        if before:
            safe(before, a, kw)
        try:
            return orig(*a, **kw)
        finally:
            if after:
                safe(after, a, kw)

    wrapper.__name__ = orig.__name__
    setattr(cls, name, wrapper)


def install() -> None:
    from mlxcel_trio import bridge
    from mlxcel_trio.engine import loop, scheduler
    from mlxcel_trio.protocol.records import SlotFreed, TokenPiece
    from mlx_lm.generate import BatchGenerator

    def job_of(handle):
        for attr in ("job_ids", "job_id", "id", "_job_id"):
            if hasattr(handle, attr):
                return getattr(handle, attr)
        return "?"

    _wrap(bridge.JobHandle, "close", before=lambda self: trace("handle.close", f"job={job_of(self)}"))
    _wrap(loop.EngineLoop, "post", before=lambda self, cmd: trace("post", type(cmd).__name__))
    _wrap(scheduler.Scheduler, "cancel",
          before=lambda self, job_id, out: trace("cancel.begin", f"job={job_id}"),
          after=lambda self, job_id, out: trace("cancel.end", f"job={job_id}"))
    _wrap(BatchGenerator, "next",
          before=lambda self: trace("gen.next.begin",
                                    f"n_gen={len(self._generation_batch)} "
                                    f"n_prompt={len(self._prompt_batch)} "
                                    f"n_waiting={len(self._unprocessed_sequences)}"),
          after=lambda self: trace("gen.next.end"))

    def on_deliver(self, batch):
        toks = sum(isinstance(e, TokenPiece) for e in batch.events)
        freed = [e.id_slot for e in batch.events if isinstance(e, SlotFreed)]
        trace("deliver", f"tokens={toks} freed={freed}")

    _wrap(bridge.Bridge, "_deliver", before=on_deliver)

    # The ASGI receive channel: when does the app learn of the disconnect?
    from mlxcel_trio.server import app as app_mod
    if not hasattr(app_mod, "_Cleanups"):
        trace("trace.missing", "server.app._Cleanups")
        return
    orig_call = app_mod._Cleanups.__call__

    async def call(self, scope, receive, send):
        if scope["type"] != "http":
            return await orig_call(self, scope, receive, send)

        async def traced_receive():
            msg = await receive()
            if msg.get("type") == "http.disconnect":
                trace("asgi.http.disconnect", scope.get("path", ""))
            return msg

        async def traced_send(msg):
            try:
                return await send(msg)
            except BaseException as exc:
                trace("asgi.send.raised", type(exc).__name__)
                raise

        return await orig_call(self, scope, traced_receive, traced_send)

    app_mod._Cleanups.__call__ = call


def main() -> int:
    install()
    from mlxcel_trio.entry import server_main
    sys.argv[0] = "mlxcel-server"
    return server_main()


if __name__ == "__main__":
    sys.exit(main())

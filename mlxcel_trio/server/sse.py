"""Server-sent events: framing, pings, and the stream driver.

`event_stream` turns a job's engine events into SSE frames.  It reads from a
channel (never yields inside a cancel scope that outlives the yield), sends a
`:` comment when the stream has been silent for `ping_s` seconds, and closes
the job handle however it ends, so a client that disconnects mid-stream
frees its slot before the engine's next forward pass.
"""

from __future__ import annotations

from typing import AsyncIterator, Callable, Iterable

import trio

from ..bridge import JobHandle
from ..engine.records import Failed, Finished
from .errors import ApiError, dumps

PING = b":\n\n"
DONE = b"data: [DONE]\n\n"


def frame(obj) -> bytes:
    return b"data: " + dumps(obj).encode() + b"\n\n"


def error_frame(err: ApiError) -> bytes:
    return frame(err.body())


async def first_event(handle: JobHandle):
    """Await the job's first event before any header is sent, so an early
    failure is an ordinary HTTP error."""
    try:
        ev = await handle.events.receive()
    except BaseException:
        handle.close()
        raise
    if isinstance(ev, Failed):
        handle.close()
        raise ApiError(ev.message, ev.kind, dict(ev.extra))
    return ev


async def event_stream(
    handle: JobHandle,
    first,
    render: Callable[[object], Iterable[bytes]],
    ping_s: float,
    trailer: bytes = b"",
) -> AsyncIterator[bytes]:
    """Yield the frames `render` makes of each event, then `trailer`."""
    try:
        ev = first
        while True:
            if isinstance(ev, Failed):
                yield error_frame(ApiError(ev.message, ev.kind, dict(ev.extra)))
                return
            for chunk in render(ev):
                yield chunk
            if isinstance(ev, Finished):
                break
            ev = None
            while ev is None:
                with trio.move_on_after(ping_s if ping_s > 0 else float("inf")):
                    ev = await handle.events.receive()
                if ev is None:
                    yield PING
        if trailer:
            yield trailer
    except trio.EndOfChannel:
        return
    finally:
        handle.close()

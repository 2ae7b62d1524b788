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

from ...bridge import JobHandle
from ...protocol.records import Failed
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


_END = object()


async def _next_or_ping(handle: JobHandle, ping_s: float):
    """The next event, None after `ping_s` of silence, or _END."""
    with trio.move_on_after(ping_s if ping_s > 0 else float("inf")):
        try:
            return await handle.events.receive()
        except trio.EndOfChannel:
            return _END
    return None


async def event_stream(
    handle: JobHandle,
    first,
    render: Callable[[object], Iterable[bytes]],
    ping_s: float,
    trailer: bytes = b"",
) -> AsyncIterator[bytes]:
    """Yield the frames `render` makes of each event until every job of the
    handle has ended, then `trailer`.  A failure ends the stream with an
    error frame (and closing the handle cancels the other jobs)."""
    try:
        ev = first
        while ev is not _END:
            if ev is None:
                yield PING
            elif isinstance(ev, Failed):
                yield error_frame(ApiError(ev.message, ev.kind, dict(ev.extra)))
                return
            else:
                for chunk in render(ev):
                    yield chunk
            ev = await _next_or_ping(handle, ping_s)
        if trailer:
            yield trailer
    finally:
        handle.close()

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
        raise ApiError.from_failed(ev)
    return ev


_END = object()
_NOTHING = object()
# events already waiting when a stream gets to send are joined into one
# write, up to this many: a stream whose sends lag the engine (many streams
# on few cores) then pays the per-write cost once per batch, not per token
COALESCE_MAX = 64


async def _next_or_ping(handle: JobHandle, ping_s: float):
    """The next event, None after `ping_s` of silence, or _END."""
    with trio.move_on_after(ping_s if ping_s > 0 else float("inf")):
        try:
            return await handle.events.receive()
        except trio.EndOfChannel:
            return _END
    return None


def _waiting(handle: JobHandle):
    """The next event if one is already queued, _END at the end, else _NOTHING."""
    try:
        return handle.events.receive_nowait()
    except trio.WouldBlock:
        return _NOTHING
    except trio.EndOfChannel:
        return _END


async def event_stream(
    handle: JobHandle,
    first,
    render: Callable[[object], Iterable[bytes]],
    ping_s: float,
    trailer: bytes = b"",
) -> AsyncIterator[bytes]:
    """Yield the frames `render` makes of each event until every job of the
    handle has ended, then `trailer`.  A failure ends the stream with an
    error frame, yielded on its own (and closing the handle cancels the
    other jobs).  Frames of events that were already waiting go out
    together in one chunk."""
    try:
        ev = first
        while ev is not _END:
            if ev is None:
                yield PING
                ev = await _next_or_ping(handle, ping_s)
                continue
            if isinstance(ev, Failed):
                yield error_frame(ApiError.from_failed(ev))
                return
            out: list[bytes] = []
            for n in range(1, COALESCE_MAX + 1):
                out.extend(render(ev))
                ev = _waiting(handle) if n < COALESCE_MAX else _NOTHING
                if ev is _NOTHING or ev is _END or isinstance(ev, Failed):
                    break
            if out:
                yield b"".join(out)
            if ev is _NOTHING:
                ev = await _next_or_ping(handle, ping_s)
        if trailer:
            yield trailer
    finally:
        handle.close()

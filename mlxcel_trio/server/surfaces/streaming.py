"""The stanza every streaming route shares: open the jobs, await the first
event, answer an SSE response.

The handle is the request's until the response takes it: a failure before
the first event is an ordinary HTTP error (and closes the handle); after
it, the frames close the handle when they end, the request's resources
close it if the response is never iterated, and with X-Conversation-Id a
stream session takes it over (sessions/streams.py).
"""

from __future__ import annotations

from typing import AsyncIterator, Callable, Iterable, Sequence

from quart import Response, request

from ...bridge import JobHandle
from ..http.resources import request_resources
from ..http.sse import event_stream, first_event
from ..request.served import Served
from ..sessions.streams import HEADER, sse_response
from ..sessions.takeover import Tap, continuation

Frames = AsyncIterator[bytes]


async def stream_jobs(served: Served, jobs: Sequence, render: Callable[[object], Iterable[bytes]],
                      ping_s: float, *, trailer: bytes = b"",
                      opened: Callable[[JobHandle], None] | None = None,
                      wrap: Callable[[Frames], Frames] | None = None) -> Response:
    """`render` makes each event's frames; `trailer` follows the last one.
    `opened` sees the handle before the first event is awaited (to make
    the completion controllable while its prompt is processed); `wrap`
    re-frames the stream (Anthropic's error events)."""
    tap = None
    if served.state.streams.shared.continues and request.headers.get(HEADER):
        # resumable, with a store: its log records what a continuation needs
        plan = continuation(request.scope)
        if plan is not None:
            jobs = plan.jobs(jobs)
        tap = Tap(jobs, plan)
        render = tap.render(render)
    resources = request_resources()
    handle = resources.own(served.bridge.open(*jobs))
    if opened is not None:
        opened(handle)
    first = await first_event(handle)
    frames = event_stream(handle, first, render, ping_s, trailer)
    return await sse_response(served.state.streams, resources, handle,
                              wrap(frames) if wrap is not None else frames, tap)

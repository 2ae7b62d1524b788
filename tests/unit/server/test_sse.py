"""The SSE driver: frames of events that were already waiting go out in one
chunk, a failure's error frame goes out on its own, and the handle is
closed however the stream ends."""

from __future__ import annotations

import trio

from mlxcel_trio.protocol.records import Failed
from mlxcel_trio.server.http import sse


class _Handle:
    def __init__(self, events: trio.MemoryReceiveChannel) -> None:
        self.events = events
        self.closed = False

    def close(self) -> None:
        self.closed = True
        self.events.close()


def _render(ev) -> list[bytes]:
    return [f"data: {ev}\n\n".encode()]


async def _collect(queued: list, *, close: bool, limit: int = 64) -> tuple[list[bytes], bool]:
    send, recv = trio.open_memory_channel(100)
    for ev in queued:
        send.send_nowait(ev)
    if close:
        send.close()
    handle = _Handle(recv)
    chunks = []
    stream = sse.event_stream(handle, "first", _render, ping_s=0, trailer=b"END")
    async for chunk in stream:
        chunks.append(chunk)
        if len(chunks) == limit:
            await stream.aclose()
            break
    return chunks, handle.closed


async def test_waiting_events_are_joined_into_one_chunk():
    chunks, closed = await _collect(["a", "b", "c"], close=True)
    assert chunks == [b"data: first\n\ndata: a\n\ndata: b\n\ndata: c\n\n", b"END"]
    assert closed


async def test_a_chunk_holds_at_most_coalesce_max_events(monkeypatch):
    monkeypatch.setattr(sse, "COALESCE_MAX", 2)
    chunks, _ = await _collect(["a", "b", "c"], close=True)
    assert chunks == [b"data: first\n\ndata: a\n\n", b"data: b\n\ndata: c\n\n", b"END"]


async def test_a_failure_is_its_own_chunk_and_ends_the_stream():
    failed = Failed(job_id=1, kind="server_error", message="boom")
    chunks, closed = await _collect(["a", failed, "never"], close=False)
    assert chunks[0] == b"data: first\n\ndata: a\n\n"
    assert chunks[1].startswith(b'data: {"error":') and b"boom" in chunks[1]
    assert len(chunks) == 2 and closed


async def test_a_live_stream_sends_what_it_has_without_waiting_for_more():
    send, recv = trio.open_memory_channel(100)
    handle = _Handle(recv)
    stream = sse.event_stream(handle, "first", _render, ping_s=0)
    assert await stream.__anext__() == b"data: first\n\n"   # nothing else queued yet
    send.send_nowait("a")
    send.send_nowait("b")
    assert await stream.__anext__() == b"data: a\n\ndata: b\n\n"
    await stream.aclose()
    assert handle.closed

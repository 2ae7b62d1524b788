"""server/sessions/streams.py: the session buffer (front-drop, offsets, followers) and
the registry (replace, cancel, TTL sweep, retention caps, key scoping; its
producers run as sessions/detached.py work), driven with a small cap through
the constructor and trio's MockClock."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from mlxcel_trio.server.sessions.streams import (
    MAX_BYTES,
    MAX_COMPLETED,
    MAX_LIVE,
    GC_INTERVAL_S,
    TTL_S,
    OffsetLost,
    StreamRegistry,
    StreamSession,
    _parse_from,
)
from mlxcel_trio.server.http.errors import ApiError
from mlxcel_trio.server.http.resources import RequestResources
from mlxcel_trio.server.sessions.detached import Detached


def test_upstream_constants():
    assert (MAX_BYTES, TTL_S, GC_INTERVAL_S) == (4 * 1024 * 1024, 300, 60)
    assert (MAX_COMPLETED, MAX_LIVE) == (256, 256)


async def test_front_drop_keeps_the_tail_and_absolute_offsets():
    s = StreamSession("c", max_bytes=10)
    s.append(b"0123456")
    assert (s.dropped, s.total_bytes, s.read(0)) == (0, 7, b"0123456")
    s.append(b"789abc")            # 13 bytes in, 3 dropped from the front
    assert (s.dropped, s.total_bytes) == (3, 13)
    assert s.read(3) == b"3456789abc"
    assert s.read(12) == b"c" and s.read(13) == b"" and s.read(99) == b""
    with pytest.raises(OffsetLost):
        s.read(2)
    s.append(b"X" * 25)            # one chunk over the cap keeps only its tail
    assert (s.dropped, s.total_bytes, s.read(28)) == (28, 38, b"X" * 10)


async def test_compaction_keeps_memory_within_a_quarter_over_the_cap():
    s = StreamSession("c", max_bytes=64)
    data = bytes(range(256)) * 40
    for i in range(0, len(data), 7):
        s.append(data[i:i + 7])
        assert len(s._buf) <= 64 + 16 + 7
        assert s.read(s.dropped) == data[:i + 7][-64:]
    assert s.total_bytes == len(data)
    s.finish()
    assert len(s._buf) == 64 and s.read(len(data) - 64) == data[-64:]


async def test_follow_replays_then_follows_live_until_done():
    s = StreamSession("c", max_bytes=1 << 20)
    s.append(b"abc")
    got = []

    async def reader():
        async for chunk in s.follow(1):
            got.append(chunk)

    async with trio.open_nursery() as n:
        n.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        assert got == [b"bc"]
        s.append(b"de")
        await trio.testing.wait_all_tasks_blocked()
        assert got == [b"bc", b"de"]
        s.finish()
        s.append(b"ignored after done")
    assert b"".join(got) == b"bcde" and s.completed_at > 0


async def test_a_follower_that_fell_past_the_drop_just_ends():
    s = StreamSession("c", max_bytes=4)
    s.append(b"abcdefgh")
    assert [c async for c in s.follow(0)] == []


def test_from_is_read_as_stoull_reads_it():
    assert _parse_from("12") == 12 and _parse_from(" 7xyz") == 7 and _parse_from("+3") == 3
    assert _parse_from("-1") == (1 << 64) - 1
    for bad in ("x", "", "99999999999999999999999"):
        with pytest.raises(ApiError, match="Invalid 'from' offset"):
            _parse_from(bad)


class _Handle:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


async def _registry(nursery: trio.Nursery, **bounds) -> StreamRegistry:
    """A registry whose producers run as the nursery's detached work."""
    detached = Detached()
    await nursery.start(detached.run)
    reg = StreamRegistry(detached, **bounds)
    await nursery.start(reg.run)
    return reg


async def _frames(gate: trio.Event, parts):
    for p in parts:
        yield p
    await gate.wait()
    yield b"end"


async def test_registry_producer_outlives_nothing_and_cancel_closes_the_job(autojump_clock):
    async with trio.open_nursery() as n:
        reg = await _registry(n, max_bytes=1 << 20)
        gate, h = trio.Event(), _Handle()
        s = await reg.open(0, "a", h, _frames(gate, [b"x", b"y"]))
        await trio.testing.wait_all_tasks_blocked()
        assert s.read(0) == b"xy" and not s.done and reg.live == 1
        reg.cancel(0, "a")
        await trio.testing.wait_all_tasks_blocked()
        assert h.closed == 1 and s.done and reg.get(0, "a") is None
        reg.cancel(0, "a")                      # idempotent
        # natural end: the job handle is closed too (a no-op for a finished job)
        gate2, h2 = trio.Event(), _Handle()
        s2 = await reg.open(0, "b", h2, _frames(gate2, [b"1"]))
        gate2.set()
        await trio.testing.wait_all_tasks_blocked()
        assert s2.done and s2.read(0) == b"1end" and h2.closed == 1 and reg.live == 0
        n.cancel_scope.cancel()


async def test_the_producer_takes_the_handle_over_from_the_request(autojump_clock):
    async with trio.open_nursery() as n:
        reg = await _registry(n)
        request, h = RequestResources(), _Handle()
        request.own(h)
        gate = trio.Event()
        s = await reg.open(0, "a", h, _frames(gate, [b"x"]), request)
        request.close()                         # the client went away
        await trio.testing.wait_all_tasks_blocked()
        assert h.closed == 0 and not s.done     # the generation goes on
        gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert h.closed == 1 and s.read(0) == b"xend"
        n.cancel_scope.cancel()


async def test_no_session_opens_while_the_registry_or_detached_work_is_down():
    detached = Detached()
    reg, h = StreamRegistry(detached), _Handle()
    with pytest.raises(ApiError) as exc:
        await reg.open(0, "a", h, _frames(trio.Event(), []))
    assert exc.value.status == 503 and h.closed == 0 and reg.get(0, "a") is None
    async with trio.open_nursery() as n:
        await n.start(reg.run)                  # the sweep alone is not enough
        with pytest.raises(ApiError):
            await reg.open(0, "a", h, _frames(trio.Event(), []))
        n.cancel_scope.cancel()


async def test_replacing_an_id_stops_the_earlier_producer(autojump_clock):
    async with trio.open_nursery() as n:
        reg = await _registry(n)
        h1, h2 = _Handle(), _Handle()
        s1 = await reg.open(0, "a", h1, _frames(trio.Event(), [b"old"]))
        await trio.testing.wait_all_tasks_blocked()
        s2 = await reg.open(0, "a", h2, _frames(trio.Event(), [b"new"]))
        await trio.testing.wait_all_tasks_blocked()
        assert h1.closed == 1 and s1.done and reg.get(0, "a") is s2 and h2.closed == 0
        n.cancel_scope.cancel()
    assert h2.closed == 1 and s2.done       # shutdown stops and finishes every session


async def test_ttl_sweep_and_completed_cap(autojump_clock):
    async with trio.open_nursery() as n:
        reg = await _registry(n, ttl_s=300, gc_interval_s=60, max_completed=3)
        for i in range(5):
            gate = trio.Event()
            gate.set()
            await reg.open(0, f"c{i}", _Handle(), _frames(gate, []))
            await trio.testing.wait_all_tasks_blocked()
        # only the newest three completed sessions are retained
        assert [reg.get(0, f"c{i}") is not None for i in range(5)] == [False, False, True, True,
                                                                       True]
        await trio.sleep(299)
        assert reg.get(0, "c4") is not None       # not yet past its TTL
        await trio.sleep(62)                      # the next sweep after the TTL
        assert all(reg.get(0, f"c{i}") is None for i in range(5))
        n.cancel_scope.cancel()


async def test_live_cap_refuses_and_keys_scope_sessions(autojump_clock):
    async with trio.open_nursery() as n:
        reg = await _registry(n, max_live=2)
        await reg.open(1, "a", _Handle(), _frames(trio.Event(), []))
        await reg.open(2, "a", _Handle(), _frames(trio.Event(), []))   # same id, other key
        with pytest.raises(ApiError) as exc:
            await reg.open(1, "b", _Handle(), _frames(trio.Event(), []))
        assert exc.value.status == 503
        await reg.open(1, "a", _Handle(), _frames(trio.Event(), []))   # a replacement fits
        assert reg.get(1, "a") is not reg.get(2, "a")
        reg.cancel(2, "a")
        assert reg.get(1, "a") is not None and reg.get(2, "a") is None
        n.cancel_scope.cancel()


async def test_lookup_matches_exact_and_model_variants_only_for_the_owner(autojump_clock):
    async with trio.open_nursery() as n:
        reg = await _registry(n)
        for owner, cid in ((0, "conv"), (0, "conv::m/a"), (0, "conversation"), (1, "conv")):
            await reg.open(owner, cid, _Handle(), _frames(trio.Event(), []))
        assert [s.conversation_id for s in reg.lookup(0, ["conv"])] == ["conv", "conv::m/a"]
        assert [s.conversation_id for s in reg.lookup(0, ["conv::m/a", "nope"])] == ["conv::m/a"]
        assert [s.owner for s in reg.lookup(1, ["conv"])] == [1]
        assert reg.lookup(0, []) == []
        n.cancel_scope.cancel()


async def test_lookup_answer_is_bounded_by_the_sessions_not_the_request(autojump_clock):
    """An id asked again adds nothing: otherwise a 64 MiB body of one short
    id repeated (16 M ids) would answer 16 M entries per matching session,
    gigabytes from one request."""
    async with trio.open_nursery() as n:
        reg = await _registry(n)
        for cid in ("conv", "conv::m/a"):
            await reg.open(0, cid, _Handle(), _frames(trio.Event(), []))
        found = reg.lookup(0, ["conv"] * 100_000 + ["conv::m/a"] * 100_000)
        assert [s.conversation_id for s in found] == ["conv", "conv::m/a", "conv::m/a"]
        n.cancel_scope.cancel()

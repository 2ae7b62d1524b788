"""server/sessions/shared.py against a real valkey-server / redis-server
(tests/store_server.py): stream chunks and their byte offsets, front-drop,
the end entry, a replaced session's late writes, an owner that is gone,
control messages, stored responses, the store's loss and return; and
store_url.py's URL checks."""

from __future__ import annotations

import pytest
import trio

from mlxcel_trio.server.sessions import shared as shared_mod
from mlxcel_trio import store_url
from mlxcel_trio.server.sessions.shared import SharedStore
from mlxcel_trio.server.sessions.store_transport import StoreDown
from tests.store_server import StoreServer, store_server  # noqa: F401  (fixture)

BOUND_S = 10.0


async def collect(it, limit: float = BOUND_S) -> bytes:
    out = b""
    with trio.fail_after(limit):
        async for chunk in it:
            out += chunk
    return out


async def flushed(store: SharedStore, gen: str, scope: int, cid: str, start: int,
                  data: bytes, **kw) -> bool:
    done = trio.Event()
    result = []

    def then(ok: bool) -> None:
        result.append(ok)
        done.set()
    store.queue(gen, scope, cid, start, data, then=then, **kw)
    with trio.fail_after(BOUND_S):
        await done.wait()
    return result[0]


@pytest.fixture
async def store(store_server, nursery, monkeypatch):  # noqa: F811
    # 3 s: short enough for the gone-owner check, long enough that a loaded CI
    # machine delaying one heartbeat (every TTL/3) never makes a live owner look gone
    monkeypatch.setenv(shared_mod.REPLICA_TTL_ENV, "3")
    s = SharedStore(store_server.url, stream_ttl_s=5, max_bytes=64)
    await nursery.start(s.run)
    yield s


async def test_chunks_keep_their_byte_offsets_and_every_key_expires(
        store, store_server):  # noqa: F811
    gen, replaced = await store.open_stream(0, "conv")
    assert replaced is None
    data = [b"data: a\n\n", b"data: bb\n\n", b"data: ccc\n\n"]
    start = 0
    for chunk in data:
        assert await flushed(store, gen, 0, "conv", start, chunk)
        start += len(chunk)
    assert await flushed(store, gen, 0, "conv", start, b"", end=True)
    full = b"".join(data)
    remote = await store.describe(0, "conv")
    assert (remote.done, remote.total_bytes, remote.replica) == (True, len(full), store.replica)
    for k in range(len(full) + 2):
        assert await collect(store.follow(remote, 0, k)) == full[k:], k
    r = store_server.client()
    keys = r.keys("mlxcel:*")
    assert keys and all(0 < r.pttl(k) <= 5000 for k in keys if not k.startswith(b"mlxcel:r:"))
    # another scope does not see it
    assert await store.describe(1, "conv") is None


async def test_front_drop_keeps_at_most_the_cap(store):
    gen, _ = await store.open_stream(0, "big")
    start = 0
    for i in range(10):
        chunk = bytes([65 + i]) * 20
        assert await flushed(store, gen, 0, "big", start, chunk)
        start += len(chunk)
    remote = await store.describe(0, "big")
    first = await store.first_offset(0, remote)
    assert 200 - 64 <= first <= 200 - 20     # whole entries, at most 64 bytes retained
    await flushed(store, gen, 0, "big", start, b"", end=True)
    assert await collect(store.follow(remote, 0, first)) == b"".join(
        bytes([65 + i]) * 20 for i in range(10))[first:]


async def test_a_follower_sees_live_chunks_then_the_end(store):
    gen, _ = await store.open_stream(0, "live")
    remote = await store.describe(0, "live")
    got: list[bytes] = []

    async def follow():
        got.append(await collect(store.follow(remote, 0, 0)))

    async with trio.open_nursery() as n:
        n.start_soon(follow)
        await flushed(store, gen, 0, "live", 0, b"one ")
        await flushed(store, gen, 0, "live", 4, b"two")
        await flushed(store, gen, 0, "live", 7, b"", end=True)
    assert got == [b"one two"]


async def test_a_replaced_sessions_late_writes_never_land(store):
    old, _ = await store.open_stream(0, "same")
    new, _ = await store.open_stream(0, "same")
    assert not (await store.describe(0, "same")).done
    await flushed(store, old, 0, "same", 0, b"stale")          # refused by the gen check
    await flushed(store, new, 0, "same", 0, b"fresh")
    await flushed(store, old, 0, "same", 5, b"", drop=True)    # the old one's removal too
    await flushed(store, new, 0, "same", 5, b"", end=True)
    remote = await store.describe(0, "same")
    assert await collect(store.follow(remote, 0, 0)) == b"fresh"


async def test_a_gone_owner_ends_its_sessions(store, store_server):  # noqa: F811
    async with trio.open_nursery() as owner_nursery:   # another replica, then gone
        owner = SharedStore(store_server.url, stream_ttl_s=5, max_bytes=64)
        await owner_nursery.start(owner.run)
        gen, _ = await owner.open_stream(0, "orphan")
        await flushed(owner, gen, 0, "orphan", 0, b"kept")
        assert (await store.describe(0, "orphan")).done is False
        owner_nursery.cancel_scope.cancel()            # its heartbeat stops
    with trio.fail_after(BOUND_S):
        while not (await store.describe(0, "orphan")).done:
            await trio.sleep(0.05)
    remote = await store.describe(0, "orphan")
    assert await collect(store.follow(remote, 0, 0)) == b"kept"


async def test_lookup_finds_ids_and_model_variants_only(store):
    for cid in ("a", "a::m1", "a::m2", "ab", "x*"):
        await store.open_stream(0, cid)
    found = sorted(s.conversation_id for s in await store.lookup(0, ["a", "a"]))
    assert found == ["a", "a::m1", "a::m2"]
    assert [s.conversation_id for s in await store.lookup(0, ["x*"])] == ["x*"]
    assert await store.lookup(0, ["x"]) == [] and await store.lookup(1, ["a"]) == []


async def test_control_messages_reach_the_owner(store):
    seen: list[dict] = []
    arrived = trio.Event()

    def handler(msg):
        seen.append(msg)
        arrived.set()
    store.on_control("cancel", handler)
    await store.send_control(store.replica, "cancel", scope="0", cid="c", gen="g")
    with trio.fail_after(BOUND_S):
        await arrived.wait()
    assert seen == [{"op": "cancel", "scope": "0", "cid": "c", "gen": "g"}]


async def test_responses_are_scoped_and_expire(store, store_server, monkeypatch):  # noqa: F811
    await store.put_response("0", "resp_1", {"obj": {"id": "resp_1"}, "history": []})
    assert (await store.get_response("0", "resp_1"))["obj"] == {"id": "resp_1"}
    assert await store.get_response("1", "resp_1") is None
    ttl = store_server.client().pttl("mlxcel:resp:0:resp_1")
    assert 0 < ttl <= shared_mod.RESPONSE_TTL_S * 1000


async def test_loss_fails_fast_and_the_return_is_picked_up():
    server = StoreServer().start()
    try:
        async with trio.open_nursery() as nursery:
            store = SharedStore(server.url, stream_ttl_s=5, max_bytes=64)
            await nursery.start(store.run)
            await store.open_stream(0, "x")
            server.stop()
            with pytest.raises(StoreDown):
                await store.open_stream(0, "y")
            with trio.fail_after(0.5):        # in the backoff: no network wait
                with pytest.raises(StoreDown):
                    await store.describe(0, "x")
            server.start()                    # same port, empty (no persistence)
            with trio.fail_after(BOUND_S):
                while True:
                    try:
                        await store.open_stream(0, "y")
                        break
                    except StoreDown:
                        await trio.sleep(0.05)
            assert (await store.describe(0, "y")) is not None
            nursery.cancel_scope.cancel()
    finally:
        server.stop()


async def test_unreachable_at_startup_starts_degraded():
    port_server = StoreServer()           # never started: nothing listens there
    async with trio.open_nursery() as nursery:
        store = SharedStore(port_server.url, stream_ttl_s=5, max_bytes=64)
        with trio.fail_after(BOUND_S):
            await nursery.start(store.run)
        assert not store.up
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(("url", "fragment"), [
    ("memory", None), ("redis://h:6379/0", None), ("rediss://:pw@h:6380/2", None),
    ("valkey://h", None), ("http://h:6379", "expected memory"),
    ("redis://:6379/0", "no host"), ("redis://h:99999/0", "not a URL"),
    ("redis://h:6379/zero", "must be a number"), ("redis", "expected memory"),
])
def test_store_urls(url, fragment):
    reason = store_url.problem(url)
    assert (reason is None) if fragment is None else (fragment in reason), reason


def test_the_password_is_never_shown():
    url = "rediss://user:s3cret@cache.internal:6380/1"
    assert store_url.redacted(url) == "rediss://cache.internal:6380/1"
    assert store_url.password(url) == "s3cret"
    assert store_url.client_url("valkeys://h:1/0") == "rediss://h:1/0"
    assert "s3cret" not in (store_url.problem("redis://:s3cret@h:1/x") or "")


async def test_a_password_in_the_url_authenticates_and_a_wrong_one_is_down(caplog):
    server = StoreServer(password="s3cret-pw").start()
    try:
        async with trio.open_nursery() as nursery:
            good = SharedStore(server.url, stream_ttl_s=5, max_bytes=64)
            await nursery.start(good.run)
            assert good.up and (await good.open_stream(0, "p"))[1] is None
            bad = SharedStore(server.url.replace("s3cret-pw", "wrong-pw"), stream_ttl_s=5,
                              max_bytes=64)
            await nursery.start(bad.run)
            assert not bad.up
            nursery.cancel_scope.cancel()
    finally:
        server.stop()
    assert "pw" not in caplog.text and "127.0.0.1" in caplog.text


async def test_a_reader_of_a_replaced_session_never_reads_its_successor(
        store, store_server):  # noqa: F811
    old, _ = await store.open_stream(0, "swap")
    await flushed(store, old, 0, "swap", 0, b"0123456789")
    reader = await store.describe(0, "swap")
    follower = store.follow(reader, 0, 5)
    with trio.fail_after(BOUND_S):
        got = [await follower.__anext__()]                     # attached, then replaced
        new, _ = await store.open_stream(0, "swap")
        await flushed(store, new, 0, "swap", 0, b"abcdefghijklmnop")
        await flushed(store, new, 0, "swap", 16, b"", end=True)
        got += [chunk async for chunk in follower]
    assert got == [b"56789"]                                   # then it ended, nothing else
    keys = store_server.client().keys("mlxcel:s:0:swap:*")
    assert keys == [f"mlxcel:s:0:swap:{new}".encode()]         # the old stream is gone


def test_the_redis_store_speaks_the_whole_session_store_protocol():
    """Every member the session rooms may call (sessions/session_store.py)
    is there on SharedStore, with the same parameters."""
    import inspect

    from mlxcel_trio.server.sessions.session_store import SessionStore

    members = [n for n in vars(SessionStore) if not n.startswith("_")]
    assert {"open_stream", "follow", "send_control", "put_response"} <= set(members)
    for name in members:
        ours = getattr(SharedStore, name, None)
        assert ours is not None, name
        want = getattr(SessionStore, name)
        if callable(want) and callable(ours):
            assert list(inspect.signature(ours).parameters) == \
                list(inspect.signature(want).parameters), name


async def test_a_gone_owner_s_session_is_claimed_once_and_its_late_writes_fenced(
        store, store_server):  # noqa: F811
    from mlxcel_trio.server.sessions.store_streams import Pending

    owner = SharedStore(store_server.url, stream_ttl_s=5, max_bytes=64)
    peer = SharedStore(store_server.url, stream_ttl_s=5, max_bytes=64)
    async with trio.open_nursery() as nursery:
        await nursery.start(peer.run)
        async with trio.open_nursery() as owner_nursery:
            await owner_nursery.start(owner.run)
            gen, _ = await owner.open_stream(0, "claimed", {"path": "/completion"})
            assert await flushed(owner, gen, 0, "claimed", 0, b"one ", tokens=[[1, 2]])
            assert await flushed(owner, gen, 0, "claimed", 4, b"two ", tokens=[[3]])
            assert await store.claim_orphans() == []      # the owner is alive: nothing
            owner_nursery.cancel_scope.cancel()            # its heartbeat stops
        with trio.fail_after(BOUND_S):   # gone, yet not ended: it waits for a takeover
            while await store.owner_alive(owner.replica):
                await trio.sleep(0.05)
        assert not (await store.describe(0, "claimed")).done
        claimed = await store.claim_orphans()
        assert await peer.claim_orphans() == []            # one replica wins it
        (rec,) = claimed
        assert (rec.cid, rec.gen, rec.attempts, bytes(rec.data), rec.tokens, rec.request) == (
            "claimed", gen, 1, b"one two ", [[1, 2, 3]], {"path": "/completion"})
        # the old owner's late write is fenced off
        await owner.call(owner._flush, [Pending(gen, 0, "claimed", 8, bytearray(b"late "))])
        assert await flushed(store, gen, 0, "claimed", 8, b"three", end=True)
        remote = await store.describe(0, "claimed")
        assert remote.done and remote.replica == store.replica
        assert await collect(store.follow(remote, 0, 0)) == b"one two three"
        nursery.cancel_scope.cancel()


async def test_an_owner_with_no_connection_left_is_claimed_before_its_ttl(
        store, store_server):  # noqa: F811
    """A SIGKILLed replica's sockets are closed by the kernel: a peer that
    finds none of its named connections claims at once, its heartbeat key
    not lapsed yet; one still connected is left alone."""
    owner = SharedStore(store_server.url, stream_ttl_s=5, max_bytes=64)
    async with trio.open_nursery() as owner_nursery:
        await owner_nursery.start(owner.run)
        gen, _ = await owner.open_stream(0, "severed", {"path": "/completion"})
        assert await flushed(owner, gen, 0, "severed", 0, b"one ", tokens=[[1]])
        assert await store.claim_orphans() == []      # connected and beating: alive
        owner_nursery.cancel_scope.cancel()
    assert await store.claim_orphans() == []          # still connected: the TTL decides
    owner._redis.connection_pool.disconnect()         # what the process's death does
    assert await store.owner_alive(owner.replica)     # its key has not lapsed
    (rec,) = await store.claim_orphans()
    assert (rec.cid, rec.attempts, bytes(rec.data)) == ("severed", 1, b"one ")
    assert not await store.owner_alive(owner.replica)

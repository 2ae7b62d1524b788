"""The shared session store: Valkey / Redis behind --session-store.

Theory of operation.  Every replica keeps doing what one server does (its
own producers, followers, registries: streams.py, control.py,
response_store.py); this store is the seam through which a replica's
sessions, stored responses and control entries become visible to its
peers.  Nothing here holds a model or a job: a replica can only *read* what
another wrote, and *ask* the owner to act.

Keys (all under `mlxcel:`, every one with an expiry, refreshed on write):

    s:<scope>:<id>:<gen>  the stream (one per session, so a reader of a
                      replaced session never reads its successor's bytes):
                      one entry per flushed chunk, entry id
                      `<start byte>-1` (so a byte offset finds its entry with
                      one XREVRANGE), and an end entry `<total>-2` {e: 1}
    m:<scope>:<id>    the session's hash: gen (one per session: a replaced
                      session's late writes are refused by the Lua scripts),
                      replica (the owner), started_at, completed_at, total, done
    r:<replica>       the owner's heartbeat; absent: the owner is gone and
                      its sessions count as ended
    c:<replica>       the owner's control stream: cancel a stream, force a
                      reasoning end, cancel a background response
    cc:<id>           a controllable completion: owner, scope, armed
    resp:<scope>:<id> a stored response (JSON)

Durability.  A chunk reaches the local followers only after it is in the
store, so a client never holds a byte the store lacks: a replica killed
mid-stream loses nothing it had sent.  One writer task flushes every
session's pending chunks in one pipelined round trip, so a busy replica
pays one round trip per flush, not per frame.

Client.  redis-py's synchronous client on worker threads: redis-py's
asyncio client does not run under trio.  coredis 6.9 (anyio) does run under
trio, but measured per-frame publishing at 8 streams on this project's
2-CPU machine was ~1.4-1.6 ms/frame with coredis (one awaited XADD per
frame), ~0.5-0.6 ms with one thread hop + XADD per frame, and ~0.04-0.12 ms
with the batched writer below over redis-py (bench/session_store.py), so
the writer and redis-py it is, with no new async stack.  Blocking reads
(XREAD BLOCK) hold a thread each, bounded by THREADS.

Loss.  A failed call marks the store down for a backoff (0.1 s doubling to
MAX_BACKOFF_S) during which calls fail fast with StoreDown; the next call
after it probes again, and the heartbeat probes even when idle, so the
store's return is picked up without a restart.  While it is down, new
resumable sessions are refused (503 naming the store), live ones go on
locally, and requests without X-Conversation-Id never touch the store.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import attrs
import trio

from ..http.errors import ApiError
from . import store_url

log = logging.getLogger("mlxcel.session_store")

P = "mlxcel:"
THREADS = 96                  # worker threads for store calls (followers block in one)
BLOCK_MS = 500                # a remote follower's XREAD BLOCK
MAX_BACKOFF_S = 5.0
REPLICA_TTL_S = 10.0          # a silent owner counts as gone after this
RESPONSE_TTL_S = 30 * 86400   # OpenAI keeps stored responses 30 days
REPLICA_TTL_ENV = "MLXCEL_INTERNAL_REPLICA_TTL_S"       # tests only
RESPONSE_TTL_ENV = "MLXCEL_INTERNAL_RESPONSE_TTL_S"     # tests only

# Writes check the session's gen first: a replaced (or deleted) session's
# late chunks never land in its successor.
_APPEND = """
if redis.call('HGET', KEYS[1], 'gen') ~= ARGV[1] then return 0 end
local ttl = tonumber(ARGV[2])
if ARGV[3] == 'd' then
  redis.call('XADD', KEYS[2], ARGV[4] .. '-1', 'd', ARGV[5])
  redis.call('HSET', KEYS[1], 'total', ARGV[6])
  if ARGV[7] ~= '' then redis.call('XTRIM', KEYS[2], 'MINID', ARGV[7]) end
elseif ARGV[3] == 'e' then
  redis.call('XADD', KEYS[2], ARGV[4] .. '-2', 'e', '1')
  redis.call('HSET', KEYS[1], 'done', '1', 'completed_at', ARGV[5])
else
  redis.call('DEL', KEYS[1], KEYS[2])
  return 1
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return 1
"""
# Claim a session id (KEYS[1]: its hash), dropping the stream of the session
# it replaces (ARGV[5]: the stream keys' prefix; with the gen it names one).
_CLAIM = """
local old = redis.call('HMGET', KEYS[1], 'replica', 'gen')
if old[2] then redis.call('DEL', ARGV[5] .. old[2]) end
redis.call('HSET', KEYS[1], 'gen', ARGV[1], 'replica', ARGV[2], 'started_at', ARGV[3],
           'completed_at', '0', 'total', '0', 'done', '0')
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return old
"""
_REMOVE = """
local old = redis.call('HMGET', KEYS[1], 'replica', 'gen')
if old[2] then redis.call('DEL', KEYS[1], ARGV[1] .. old[2]) end
return old
"""


class StoreDown(Exception):
    """The store did not answer (or is in its backoff)."""


def unavailable(url: str) -> ApiError:
    return ApiError(f"the session store ({url}) is unavailable; resumable streams "
                    "(X-Conversation-Id) and stored responses shared between replicas are "
                    "refused until it returns; retry later, or send the request without "
                    "X-Conversation-Id", "unavailable_error")


@attrs.frozen
class RemoteSession:
    """A session as the store describes it (owned by any replica)."""
    conversation_id: str
    gen: str
    replica: str
    started_at: int
    completed_at: int
    total_bytes: int
    done: bool


def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default


@attrs.define(eq=False)
class _Pending:
    gen: str
    scope: int
    cid: str
    start: int                       # the absolute offset of data[0]
    data: bytearray = attrs.field(factory=bytearray)
    end: bool = False
    drop: bool = False
    then: list[Callable[[bool], None]] = attrs.field(factory=list)   # applied after the flush


class SharedStore:
    def __init__(self, url: str, *, stream_ttl_s: float, max_bytes: int) -> None:
        import redis  # optional dependency: the `redis` extra

        self.url = url
        self.shown = store_url.redacted(url)
        self.replica = uuid.uuid4().hex[:16]
        self.stream_ttl_ms = int(stream_ttl_s * 1000)
        self.response_ttl_ms = int(_seconds(RESPONSE_TTL_ENV, RESPONSE_TTL_S) * 1000)
        self.replica_ttl_s = _seconds(REPLICA_TTL_ENV, REPLICA_TTL_S)
        self.max_bytes = max_bytes
        self._errors = (redis.exceptions.RedisError, OSError)
        self._refused = redis.exceptions.ResponseError
        self._redis = redis.Redis.from_url(
            store_url.client_url(url), socket_timeout=BLOCK_MS / 1000 + 5,
            socket_connect_timeout=2, max_connections=THREADS + 8)
        self._append = self._redis.register_script(_APPEND)
        self._claim = self._redis.register_script(_CLAIM)
        self._remove = self._redis.register_script(_REMOVE)
        self._limiter = trio.CapacityLimiter(THREADS)
        self._down_until = 0.0          # trio clock
        self._backoff = 0.0
        self._was_down = False
        self._pending: OrderedDict[str, _Pending] = OrderedDict()   # by session gen
        self._wake = trio.Event()
        self._handlers: dict[str, Callable[[dict[str, str]], None]] = {}
        self._ticks: list[Callable[[], None]] = []
        self._deferred_send, self._deferred = trio.open_memory_channel[
            Callable[[], Awaitable[None]]](1024)

    # -- calls -----------------------------------------------------------------------------

    @property
    def up(self) -> bool:
        return trio.current_time() >= self._down_until

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(redis client, *args) on a worker thread; StoreDown on failure."""
        if not self.up:
            raise StoreDown(self.shown)
        try:
            result = await trio.to_thread.run_sync(fn, self._redis, *args,
                                                   limiter=self._limiter,
                                                   abandon_on_cancel=True)
        except self._refused as exc:   # the store answered: it is up, the command failed
            log.error("session store %s refused a command: %s", self.shown, exc)
            raise StoreDown(self.shown) from None
        except self._errors as exc:
            self._failed(exc)
            raise StoreDown(self.shown) from None
        if self._was_down:
            self._was_down = False
            log.warning("session store %s is back", self.shown)
        self._backoff = 0.0
        return result

    def _failed(self, exc: BaseException) -> None:
        self._backoff = min(MAX_BACKOFF_S, max(0.1, self._backoff * 2))
        self._down_until = trio.current_time() + self._backoff
        if not self._was_down:
            self._was_down = True
            log.warning("session store %s is unavailable (%s): resumable streams are refused "
                        "until it returns", self.shown, type(exc).__name__)

    # -- lifetime --------------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            try:
                # the first heartbeat, before any stream can be opened: a peer
                # must never read a just-started replica's session as orphaned
                await self._beat()
                log.info("session store %s: replica %s", self.shown, self.replica)
            except StoreDown:
                log.warning("session store %s is unreachable at startup: serving degraded "
                            "(resumable streams refused) until it answers", self.shown)
            nursery.start_soon(self._heartbeat)
            nursery.start_soon(self._writer)
            nursery.start_soon(self._control_reader)
            task_status.started()

    async def _beat(self) -> None:
        """This replica's heartbeat key, alive for one replica TTL."""
        key, ttl_ms = P + "r:" + self.replica, int(self.replica_ttl_s * 1000)
        await self.call(lambda r: r.set(key, b"1", px=ttl_ms))

    async def _heartbeat(self) -> None:
        while True:   # run() wrote the first beat
            await trio.sleep(min(self.replica_ttl_s / 3, max(self._backoff, 0.1))
                             if self._was_down else self.replica_ttl_s / 3)
            for tick in self._ticks:
                tick()
            if self.up:
                try:
                    await self._beat()
                except StoreDown:
                    pass

    def on_tick(self, fn: Callable[[], None]) -> None:
        """Call `fn()` at every heartbeat (a third of the replica TTL)."""
        self._ticks.append(fn)

    def defer(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Run `fn()` soon, in order, on the writer, before the chunks queued
        after it (bounded: with 1024 waiting the newest is dropped: these are
        best-effort publications)."""
        try:
            self._deferred_send.send_nowait(fn)
            self._wake.set()
        except trio.WouldBlock:
            log.warning("session store %s: publication queue full", self.shown)

    async def owner_alive(self, replica: str) -> bool:
        if replica == self.replica:
            return True
        return bool(await self.call(lambda r: r.exists(P + "r:" + replica)))

    # -- control: ask an owner to act -------------------------------------------------------

    def on_control(self, op: str, fn: Callable[[dict[str, str]], None]) -> None:
        self._handlers[op] = fn

    async def send_control(self, replica: str, op: str, **fields: str) -> None:
        key = P + "c:" + replica
        ttl_ms = int(self.replica_ttl_s * 1000) * 3

        def send(r):
            pipe = r.pipeline(transaction=False)
            pipe.xadd(key, {"op": op, **fields}, maxlen=1024, approximate=True)
            pipe.pexpire(key, ttl_ms)
            pipe.execute()
        await self.call(send)

    async def _control_reader(self) -> None:
        key = P + "c:" + self.replica
        last = "0-0"   # the stream is this process's own (a fresh replica id)
        while True:
            if not self.up:
                await trio.sleep(max(self._backoff, 0.1))
                continue
            try:
                got = await self.call(lambda r, at: r.xread({key: at}, count=64, block=BLOCK_MS),
                                      last)
            except StoreDown:
                continue
            for _stream, entries in got or ():
                for entry_id, fields in entries:
                    last = entry_id.decode()
                    msg = {k.decode(): v.decode() for k, v in fields.items()}
                    handler = self._handlers.get(msg.get("op", ""))
                    if handler is not None:
                        try:
                            handler(msg)
                        except Exception:  # one bad message never stops control
                            log.exception("session store control message failed")

    # -- streams: the owner's side -----------------------------------------------------------

    @staticmethod
    def _meta(scope: int, cid: str) -> str:
        return f"{P}m:{scope}:{cid}"

    @staticmethod
    def _stream(scope: int, cid: str, gen: str = "") -> str:
        return f"{P}s:{scope}:{cid}:{gen}"

    async def open_stream(self, scope: int, cid: str) -> tuple[str, tuple[str, str] | None]:
        """Claim (scope, cid) for this replica; (the new gen, (owner, gen) of
        the session it replaces when another replica owns that one)."""
        gen = uuid.uuid4().hex
        args = [gen, self.replica, str(int(time.time())), self.stream_ttl_ms,
                self._stream(scope, cid)]
        owner, old = await self.call(lambda r: self._claim([self._meta(scope, cid)], args))
        if owner is None or old is None or owner.decode() == self.replica:
            return gen, None
        return gen, (owner.decode(), old.decode())

    def queue(self, gen: str, scope: int, cid: str, start: int, data: bytes, *,
              end: bool = False, drop: bool = False,
              then: Callable[[bool], None] | None = None) -> None:
        """Queue a chunk (or the end, or the removal) for the writer; `then`
        runs after the flush with whether it reached the store."""
        pending = self._pending.get(gen)
        if pending is None:
            pending = self._pending[gen] = _Pending(gen, scope, cid, start)
        pending.data += data
        pending.end |= end
        pending.drop |= drop
        if then is not None:
            pending.then.append(then)
        self._wake.set()

    async def _writer(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            # publications first: one queued before a chunk lands before it
            while True:
                try:
                    fn = self._deferred.receive_nowait()
                except trio.WouldBlock:
                    break
                try:
                    await fn()
                except StoreDown:
                    pass
                except Exception:  # a bad publication never stops the writer
                    log.exception("session store: a queued publication failed")
            batch, self._pending = list(self._pending.values()), OrderedDict()
            if not batch:
                continue
            ok = True
            try:
                await self.call(self._flush, batch)
            except StoreDown:
                ok = False
            for pending in batch:
                for then in pending.then:
                    try:
                        then(ok)
                    except Exception:  # one session's bug never stops the writer
                        log.exception("session store: applying a flushed chunk failed")

    def _flush(self, r, batch: list[_Pending]) -> None:
        pipe = r.pipeline(transaction=False)
        now = str(int(time.time()))
        for p in batch:
            keys = [self._meta(p.scope, p.cid), self._stream(p.scope, p.cid, p.gen)]
            if p.drop:
                self._append(keys, [p.gen, self.stream_ttl_ms, "x"], client=pipe)
                continue
            total = p.start + len(p.data)
            if p.data:
                minid = f"{total - self.max_bytes}-0" if total > self.max_bytes else ""
                self._append(keys, [p.gen, self.stream_ttl_ms, "d", p.start, bytes(p.data),
                                    total, minid], client=pipe)
            if p.end:
                self._append(keys, [p.gen, self.stream_ttl_ms, "e", total, now], client=pipe)
        pipe.execute()

    # -- streams: any replica's side ---------------------------------------------------------

    async def describe(self, scope: int, cid: str) -> RemoteSession | None:
        meta = self._meta(scope, cid)
        raw = await self.call(lambda r: r.hgetall(meta))
        return await self._session(cid, raw) if raw else None

    async def _session(self, cid: str, raw: dict) -> RemoteSession | None:
        f = {k.decode(): v.decode() for k, v in raw.items()}
        if "gen" not in f:
            return None
        done = f.get("done") == "1" or not await self.owner_alive(f["replica"])
        return RemoteSession(cid, f["gen"], f["replica"], int(f.get("started_at", 0)),
                             int(f.get("completed_at", 0)), int(f.get("total", 0)), done)

    async def lookup(self, scope: int, ids: list[str]) -> list[RemoteSession]:
        """For each asked id in order: its session and every `<id>::<model>`
        variant (as StreamRegistry.lookup).  One SCAN of the scope's
        sessions whatever the number of ids asked."""
        prefix = f"{P}m:{scope}:"
        wanted = list(dict.fromkeys(ids))

        def matching(r) -> list[tuple[str, dict]]:
            cids = [k[len(prefix):].decode() for k in r.scan_iter(match=prefix + "*", count=1000)]
            by_prefix: dict[str, list[str]] = {}
            for cid in sorted(cids):
                by_prefix.setdefault(cid, []).append(cid)
                parts = cid.split("::")
                for i in range(1, len(parts)):
                    by_prefix.setdefault("::".join(parts[:i]), []).append(cid)
            found = list(dict.fromkeys(c for rid in wanted for c in by_prefix.get(rid, ())))
            pipe = r.pipeline(transaction=False)
            for cid in found:
                pipe.hgetall(prefix + cid)
            return list(zip(found, pipe.execute()))
        out = []
        for cid, raw in await self.call(matching):
            session = await self._session(cid, raw) if raw else None
            if session is not None:
                out.append(session)
        return out

    async def first_offset(self, scope: int, session: RemoteSession) -> int:
        """The first byte still retained (front-drop), or 0."""
        stream = self._stream(scope, session.conversation_id, session.gen)
        first = await self.call(lambda r: r.xrange(stream, count=1))
        return int(first[0][0].split(b"-")[0]) if first else 0

    async def follow(self, session: RemoteSession, scope: int, offset: int) -> AsyncIterator[bytes]:
        """Bytes from `offset`, then live ones until the session ends, its
        owner is gone, or it was replaced or deleted."""
        try:
            async for chunk in self._follow(session, scope, offset):
                yield chunk
        except StoreDown:
            return   # the client reconnects once the store is back

    async def _follow(self, session: RemoteSession, scope: int,
                      offset: int) -> AsyncIterator[bytes]:
        meta = self._meta(scope, session.conversation_id)
        stream = self._stream(scope, session.conversation_id, session.gen)
        before = await self.call(lambda r: r.xrevrange(stream, max=f"{offset}-1", count=1))
        last = f"{int(before[0][0].split(b'-')[0])}-0" if before else "0-0"
        while True:
            got = await self.call(lambda r, at: r.xread({stream: at}, count=256, block=BLOCK_MS),
                                  last)
            if not got:
                raw = await self.call(lambda r: r.hgetall(meta))
                now = await self._session(session.conversation_id, raw) if raw else None
                if now is not None and now.gen == session.gen and not now.done:
                    continue
                if now is not None and now.gen == session.gen:
                    # ended (or its owner is gone): what is left, then stop
                    tail = await self.call(lambda r, at: r.xrange(stream, min=f"({at}"), last)
                    for chunk in self._chunks(tail, offset):
                        if chunk is None:
                            return
                        offset += len(chunk)
                        yield chunk
                return   # replaced or deleted
            for _name, entries in got:
                last = entries[-1][0].decode()
                for chunk in self._chunks(entries, offset):
                    if chunk is None:
                        return
                    offset += len(chunk)
                    yield chunk

    @staticmethod
    def _chunks(entries, offset: int):
        """The new bytes of each entry past `offset`; None at the end (or at
        a gap: the reader fell behind the front-drop, as upstream's ends)."""
        for entry_id, fields in entries:
            start, kind = (int(x) for x in entry_id.split(b"-"))
            if kind == 2 or b"e" in fields:
                yield None
                return
            data = fields[b"d"]
            if start > offset:
                yield None
                return
            if start + len(data) > offset:
                yield data[offset - start:]
                offset = start + len(data)

    async def delete_stream(self, scope: int, cid: str) -> tuple[str, str] | None:
        """Remove the session from the store; (its owner, its gen) when the
        owner is another replica, which must then be asked to stop it."""
        owner, gen = await self.call(lambda r: self._remove(
            [self._meta(scope, cid)], [self._stream(scope, cid)]))
        if owner is None or gen is None or owner.decode() == self.replica:
            return None
        return owner.decode(), gen.decode()

    # -- controllable completions -------------------------------------------------------------

    async def register_completion(self, cid: str, scope: str, armed: bool) -> None:
        ttl = self.stream_ttl_ms
        await self.call(lambda r: r.set(P + "cc:" + cid, json.dumps(
            {"replica": self.replica, "scope": scope, "armed": armed}), px=ttl))

    async def drop_completion(self, cid: str) -> None:
        await self.call(lambda r: r.delete(P + "cc:" + cid))

    async def find_completion(self, cid: str) -> dict | None:
        raw = await self.call(lambda r: r.get(P + "cc:" + cid))
        return json.loads(raw) if raw else None

    # -- stored responses ----------------------------------------------------------------------

    async def put_response(self, scope: str, rid: str, record: dict) -> None:
        data = json.dumps({**record, "replica": self.replica}, separators=(",", ":"))
        ttl = self.response_ttl_ms
        await self.call(lambda r: r.set(f"{P}resp:{scope}:{rid}", data, px=ttl))

    async def get_response(self, scope: str, rid: str) -> dict | None:
        raw = await self.call(lambda r: r.get(f"{P}resp:{scope}:{rid}"))
        return json.loads(raw) if raw else None

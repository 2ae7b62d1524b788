"""The session store's stream log: the owner claims a session and its batched
writer appends chunks; any replica describes, looks up and follows one
(the keys and the Lua scripts' rules are sessions/shared.py's docstring).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable

import attrs
import trio

from .store_transport import BLOCK_MS, P, StoreDown

log = logging.getLogger("mlxcel.session_store")

MAX_ATTEMPTS = 3   # continuations of one session (takeover.py), killed ones included

# Writes check the session's gen first: a replaced (or deleted) session's
# late chunks never land in its successor; then its owner (the last ARGV):
# once a peer took the session over (TAKEOVER), the old owner's late writes
# are fenced off.  KEYS[3]: the session's token ids, one JSON entry per chunk
# (a list, never trimmed: a continuation needs every id).
APPEND = """
if redis.call('HGET', KEYS[1], 'gen') ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'replica') ~= ARGV[#ARGV] then return 0 end
local ttl = tonumber(ARGV[2])
if ARGV[3] == 'd' then
  redis.call('XADD', KEYS[2], ARGV[4] .. '-1', 'd', ARGV[5])
  redis.call('HSET', KEYS[1], 'total', ARGV[6])
  if ARGV[7] ~= '' then redis.call('XTRIM', KEYS[2], 'MINID', ARGV[7]) end
  if ARGV[8] ~= '' then
    redis.call('RPUSH', KEYS[3], ARGV[8])
    redis.call('PEXPIRE', KEYS[3], ttl)
  end
elseif ARGV[3] == 'e' then
  redis.call('XADD', KEYS[2], ARGV[4] .. '-2', 'e', '1')
  redis.call('HSET', KEYS[1], 'done', '1', 'completed_at', ARGV[5])
else
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
  return 1
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return 1
"""
# Claim a session id (KEYS[1]: its hash), dropping the stream of the session
# it replaces (ARGV[5]: the stream keys' prefix; with the gen it names one).
CLAIM = """
local old = redis.call('HMGET', KEYS[1], 'replica', 'gen')
if old[2] then redis.call('DEL', ARGV[5] .. old[2], ARGV[6] .. old[2]) end
redis.call('HSET', KEYS[1], 'gen', ARGV[1], 'replica', ARGV[2], 'started_at', ARGV[3],
           'completed_at', '0', 'total', '0', 'done', '0', 'epoch', '0', 'attempts', '0',
           'req', ARGV[7])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return old
"""
REMOVE = """
local old = redis.call('HMGET', KEYS[1], 'replica', 'gen')
if old[2] then redis.call('DEL', KEYS[1], ARGV[1] .. old[2], ARGV[2] .. old[2]) end
return old
"""
# A live replica takes over an orphaned session (KEYS[1]: its hash, KEYS[2]:
# the owner's heartbeat key): only while the owner it saw (ARGV[1]) still
# owns it, its heartbeat is gone and it has not ended; the owner becomes
# ARGV[2] and the epoch and attempt count go up by one (the attempts).
TAKEOVER = """
local f = redis.call('HMGET', KEYS[1], 'replica', 'done', 'epoch', 'attempts', 'gen')
if not f[5] or f[1] ~= ARGV[1] or f[2] == '1' then return false end
if redis.call('EXISTS', KEYS[2]) == 1 then return false end
local a = tonumber(f[4] or '0') + 1
redis.call('HSET', KEYS[1], 'replica', ARGV[2], 'epoch', tostring(tonumber(f[3] or '0') + 1),
           'attempts', tostring(a))
return a
"""


def connection_name(replica: str) -> str:
    """The name (CLIENT SETNAME) of each of a replica's store connections."""
    return "mlxcel-" + replica


@attrs.define(eq=False)
class Recovered:
    """A session read back from its log (a restart, file_store.py) or claimed
    from a gone owner (Redis, TAKEOVER), for its continuation."""
    scope: int
    cid: str
    gen: str
    started_at: int
    request: dict | None
    first: int = 0                     # the offset of data[0] (front-drop)
    data: bytearray = attrs.field(factory=bytearray)
    tokens: list[list[int]] = attrs.field(factory=list)   # per job
    attempts: int = 0
    done: bool = False
    completed_at: int = 0
    length: int = 0                    # the log's bytes up to its last whole record

    @property
    def total(self) -> int:
        return self.first + len(self.data)


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


@attrs.define(eq=False)
class Pending:
    gen: str
    scope: int
    cid: str
    start: int                       # the absolute offset of data[0]
    data: bytearray = attrs.field(factory=bytearray)
    end: bool = False
    drop: bool = False
    then: list[Callable[[bool], None]] = attrs.field(factory=list)   # applied after the flush
    tokens: list[list[int]] = attrs.field(factory=list)   # per job: the ids of data's frames


def enqueue(pending_by_gen: "OrderedDict[str, Pending]", gen: str, scope: int, cid: str,
            start: int, data: bytes, end: bool, drop: bool,
            then: Callable[[bool], None] | None, tokens: list[list[int]] | None) -> None:
    """Join a chunk (or the end, or the removal) into its session's pending write."""
    pending = pending_by_gen.get(gen)
    if pending is None:
        pending = pending_by_gen[gen] = Pending(gen, scope, cid, start)
    pending.data += data
    pending.end |= end
    pending.drop |= drop
    if then is not None:
        pending.then.append(then)
    for i, ids in enumerate(tokens or ()):
        while len(pending.tokens) <= i:
            pending.tokens.append([])
        pending.tokens[i].extend(ids)


def applied(batch: list[Pending], ok: bool) -> None:
    """Run each flushed chunk's callbacks with whether it reached the store."""
    for pending in batch:
        for then in pending.then:
            try:
                then(ok)
            except Exception:  # one session's bug never stops the writer
                log.exception("session store: applying a flushed chunk failed")


class StreamLog:
    """The stream methods of `SharedStore`."""

    @staticmethod
    def _meta(scope: int, cid: str) -> str:
        return f"{P}m:{scope}:{cid}"

    @staticmethod
    def _stream(scope: int, cid: str, gen: str = "") -> str:
        return f"{P}s:{scope}:{cid}:{gen}"

    @staticmethod
    def _ids(scope: int, cid: str, gen: str = "") -> str:
        return f"{P}t:{scope}:{cid}:{gen}"

    async def open_stream(self, scope: int, cid: str, record: dict | None = None
                          ) -> tuple[str, tuple[str, str] | None]:
        """Claim (scope, cid) for this replica; (the new gen, (owner, gen) of
        the session it replaces when another replica owns that one).  The
        request `record` (takeover.py) is kept in its hash."""
        gen = uuid.uuid4().hex
        args = [gen, self.replica, str(int(time.time())), self.stream_ttl_ms,
                self._stream(scope, cid), self._ids(scope, cid),
                json.dumps(record, separators=(",", ":")) if record is not None else ""]
        owner, old = await self.call(lambda r: self._claim([self._meta(scope, cid)], args))
        if owner is None or old is None or owner.decode() == self.replica:
            return gen, None
        return gen, (owner.decode(), old.decode())

    def queue(self, gen: str, scope: int, cid: str, start: int, data: bytes, *,
              end: bool = False, drop: bool = False,
              then: Callable[[bool], None] | None = None,
              tokens: list[list[int]] | None = None) -> None:
        """Queue a chunk (or the end, or the removal) for the writer; `then`
        runs after the flush with whether it reached the store.  `tokens`
        (the chunk's token ids per job, takeover.py) go with the chunk."""
        enqueue(self._pending, gen, scope, cid, start, data, end, drop, then, tokens)
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
                self._flushing = True
                await self.call(self._flush, batch)
            except StoreDown:
                ok = False
            finally:
                self._flushing = False
            applied(batch, ok)

    def _flush(self, r, batch: list[Pending]) -> None:
        pipe = r.pipeline(transaction=False)
        now = str(int(time.time()))
        me = self.replica
        for p in batch:
            keys = [self._meta(p.scope, p.cid), self._stream(p.scope, p.cid, p.gen),
                    self._ids(p.scope, p.cid, p.gen)]
            if p.drop:
                self._append(keys, [p.gen, self.stream_ttl_ms, "x", me], client=pipe)
                continue
            total = p.start + len(p.data)
            if p.data:
                minid = f"{total - self.max_bytes}-0" if total > self.max_bytes else ""
                ids = json.dumps(p.tokens, separators=(",", ":")) if p.tokens else ""
                self._append(keys, [p.gen, self.stream_ttl_ms, "d", p.start, bytes(p.data),
                                    total, minid, ids, me], client=pipe)
            if p.end:
                self._append(keys, [p.gen, self.stream_ttl_ms, "e", total, now, me],
                             client=pipe)
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
        done = f.get("done") == "1"
        if not done and not await self.owner_alive(f["replica"]):
            # its owner is gone: ended, unless a live replica will continue it
            # (it holds a request record and has attempts left: takeover.py)
            done = not f.get("req") or int(f.get("attempts", 0)) >= MAX_ATTEMPTS
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

    # -- takeover: claiming a gone owner's sessions --------------------------------------

    def recovered(self) -> list[Recovered]:
        return []   # nothing to read back at startup: peers' sessions are claimed live

    async def claim_orphans(self) -> list[Recovered]:
        """Take over every unfinished session that holds a request record and
        whose owner's heartbeat is gone (TAKEOVER: one replica wins each), each
        read back whole for its continuation."""
        me, prefix = self.replica, P + "m:"

        def scan(r) -> list[Recovered]:
            keys = list(r.scan_iter(match=prefix + "*", count=1000))
            pipe = r.pipeline(transaction=False)
            for key in keys:
                pipe.hmget(key, "replica", "done", "gen", "req")
            found = [(k, f[0].decode()) for k, f in zip(keys, pipe.execute())
                     if f[0] is not None and f[2] is not None and f[1] != b"1" and f[3]
                     and f[0].decode() != me]
            owners = list({o for _, o in found})
            pipe = r.pipeline(transaction=False)
            for o in owners:
                pipe.exists(P + "r:" + o)
            alive = {o for o, e in zip(owners, pipe.execute()) if e}
            for o in alive - self._connected(r, alive):
                # its heartbeat key has not lapsed yet, but the process holds no
                # connection: it died (the kernel closed its sockets); dropping
                # the key lets TAKEOVER (which still checks it) claim at once
                log.info("session store: replica %s has no connection left: its "
                         "sessions are claimed before its heartbeat lapses", o)
                r.delete(P + "r:" + o)
                alive.discard(o)
            out = []
            for key, owner in found:
                if owner in alive:
                    continue
                attempts = self._takeover([key, P + "r:" + owner], [owner, me])
                if attempts:
                    out.append(self._read_back(r, key.decode()[len(prefix):], int(attempts)))
            return out
        return await self.call(scan)

    def _connected(self, r, owners: set[str]) -> set[str]:
        """Those of `owners` with a connection to the store (each replica
        names its connections, connection_name).  A store that refuses
        CLIENT LIST (an ACL) answers all: the heartbeat TTL alone decides."""
        if not owners or self._no_client_list:
            return owners
        try:
            names = {c.get("name", "") for c in r.client_list()}
        except self._refused:
            self._no_client_list = True
            log.info("session store %s refuses CLIENT LIST: a dead replica's sessions are "
                     "claimed once its heartbeat lapses", self.shown)
            return owners
        return {o for o in owners if connection_name(o) in names}

    def _read_back(self, r, scoped: str, attempts: int) -> Recovered:
        scope, cid = scoped.split(":", 1)
        f = {k.decode(): v.decode() for k, v in r.hgetall(self._meta(int(scope), cid)).items()}
        gen = f["gen"]
        rec = Recovered(int(scope), cid, gen, int(f.get("started_at", 0)),
                        json.loads(f["req"]) if f.get("req") else None, attempts=attempts)
        entries = r.xrange(self._stream(int(scope), cid, gen))
        for n, (entry_id, fields) in enumerate(entries):
            start, kind = (int(x) for x in entry_id.split(b"-"))
            if kind != 1:
                continue
            if n == 0:
                rec.first = start
            rec.data += fields[b"d"]
        for raw in r.lrange(self._ids(int(scope), cid, gen), 0, -1):
            for i, ids in enumerate(json.loads(raw)):
                while len(rec.tokens) <= i:
                    rec.tokens.append([])
                rec.tokens[i].extend(ids)
        return rec

    async def delete_stream(self, scope: int, cid: str) -> tuple[str, str] | None:
        """Remove the session from the store; (its owner, its gen) when the
        owner is another replica, which must then be asked to stop it."""
        owner, gen = await self.call(lambda r: self._remove(
            [self._meta(scope, cid)], [self._stream(scope, cid), self._ids(scope, cid)]))
        if owner is None or gen is None or owner.decode() == self.replica:
            return None
        return owner.decode(), gen.decode()

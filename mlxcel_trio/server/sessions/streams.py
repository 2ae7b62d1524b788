"""Streams that survive reconnects: X-Conversation-Id sessions.

Theory of operation.  A streaming request that carries `X-Conversation-Id`
hands its job handle and its frame iterator to `StreamRegistry.open`, which
starts a *producer* task as detached work (sessions/detached.py: a nursery
under the root nursery, not the request's), moving the handle off the
request.  The producer drains the frames into the
session's byte buffer; the request's response, and every later
`GET /v1/stream?conv_id=&from=N`, is only a *follower* of that buffer.  So a
client disconnect cancels a follower and nothing else: the generation runs to
its natural stop, and a reconnect at byte offset K reads exactly the bytes the
first connection would have read after K.

Who owns what: the producer's task owns the job handle (it is closed
however the task ends, which is the same `Cancel` a disconnect posts on the plain path); the
registry owns the sessions; a follower owns nothing.  `DELETE /v1/stream`
evicts the session and cancels the producer's scope.

Bounds (upstream's constants, server-stream.cpp): 4 MiB per session with
front-drop, completed sessions kept 300 s after they end, swept every 60 s.
Ours on top: at most 256 completed sessions retained (oldest evicted first),
at most 256 live ones (the 257th is refused with a 503 before any byte is
sent), and an id of at most 256 printable ASCII characters.

With more than one API key, sessions are keyed by (key index, id), so one key
cannot see, replace or stop another key's session: for it the session does
not exist (the manifest records this as by_design).

The TTL and the sweep interval can be shortened for tests through two internal
environment variables (STREAM_TTL_ENV, STREAM_GC_ENV); they are not options.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections import OrderedDict
from contextlib import aclosing
from typing import AsyncIterator, Iterable

import trio
from quart import Response, request

from ...bridge import JobHandle
from ..http.body import read_json_body
from ..http.errors import ApiError, json_response, not_found
from ..http.key_scope import key_scope
from ..http import request_tape
from ..http.resources import RequestResources
from .detached import Detached
from .memory_store import MemoryStore
from .session_store import SessionStore
from .store_streams import RemoteSession
from .store_transport import StoreDown, unavailable
from .takeover import Tap, request_record

log = logging.getLogger("mlxcel.streams")

HEADER = "X-Conversation-Id"
SSE_TYPE = "text/event-stream"

MAX_BYTES = 4 * 1024 * 1024      # upstream STREAM_SESSION_MAX_BYTES
TTL_S = 300.0                    # upstream STREAM_SESSION_TTL_SECONDS
GC_INTERVAL_S = 60.0             # upstream STREAM_SESSION_GC_INTERVAL_SECONDS
MAX_COMPLETED = 256              # ours: completed sessions retained at most
MAX_LIVE = 256                   # ours: sessions still generating at most
MAX_ID_CHARS = 256               # ours: printable ASCII, no spaces
STREAM_TTL_ENV = "MLXCEL_INTERNAL_STREAM_TTL_S"     # tests only
STREAM_GC_ENV = "MLXCEL_INTERNAL_STREAM_GC_S"       # tests only

_VALID_ID = re.compile(r"[\x21-\x7e]{1,%d}" % MAX_ID_CHARS)
_FROM = re.compile(r"\s*([+-]?)(\d+)")
_U64 = 1 << 64

Key = tuple[int, str]            # (API key index, or 0 with fewer than two keys; id)


class StreamSession:
    """One conversation's on-wire SSE bytes, front-dropped past `max_bytes`.

    Byte offsets are absolute: `dropped` bytes left the front, the retained
    ones are `_buf[_head:]`.  The dead head is compacted away once it reaches
    a quarter of the cap (and when the session ends), so a front-drop costs
    O(1) amortized and a session holds at most 1.25 x the cap."""

    def __init__(self, conversation_id: str, owner: int = 0, max_bytes: int = MAX_BYTES) -> None:
        self.conversation_id = conversation_id
        self.owner = owner
        self.started_at = int(time.time())
        self.completed_at = 0            # unix seconds once done, as upstream
        self.ended = math.inf            # trio clock once done (the TTL runs from here)
        self.dropped = 0
        self.done = False
        self.scope = trio.CancelScope()  # the producer's; cancelled by DELETE / replace
        self.gen = ""                    # this session's generation in the store
        self.queued = 0                  # bytes handed to the store's writer
        self.tap = None                  # with a store: records its token ids (takeover.py)
        self.handed_off = False          # SIGTERM: left unfinished in the store for a peer
        self._cap = max_bytes
        self._buf = bytearray()
        self._head = 0
        self._changed = trio.Event()

    @property
    def total_bytes(self) -> int:
        return self.dropped + len(self._buf) - self._head

    def append(self, data: bytes) -> None:
        if self.done or not data:
            return
        self._buf += data
        excess = len(self._buf) - self._head - self._cap
        if excess > 0:
            self._head += excess
            self.dropped += excess
            if self._head >= max(1, self._cap // 4):
                self._compact()
        self._wake()

    def preload(self, first: int, data: bytes) -> None:
        """Bytes an earlier process published, from absolute offset `first`."""
        self.dropped, self._buf, self._head = first, bytearray(data), 0

    def _compact(self) -> None:
        del self._buf[:self._head]
        self._head = 0

    def finish(self) -> None:
        if self.done:
            return
        self.done = True
        self._compact()
        self.completed_at = int(time.time())
        self.ended = trio.current_time()
        self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def read(self, offset: int) -> bytes:
        """The retained bytes from `offset` on (b"" at or past the end)."""
        if offset < self.dropped:
            raise OffsetLost(offset)
        start = self._head + offset - self.dropped
        return bytes(self._buf[start:]) if start < len(self._buf) else b""

    async def follow(self, offset: int) -> AsyncIterator[bytes]:
        """Bytes from `offset`, then live ones until the session is done.  A
        follower that fell behind past the front-drop just ends, as
        upstream's reader does."""
        while True:
            try:
                chunk = self.read(offset)
            except OffsetLost:
                return
            if chunk:
                offset += len(chunk)
                yield chunk
            elif self.done:
                return
            else:
                await self._changed.wait()


class OffsetLost(Exception):
    pass


class StreamRegistry:
    """Every session; their producers run as `detached` work."""

    def __init__(self, detached: Detached, *, max_bytes: int = MAX_BYTES, ttl_s: float = TTL_S,
                 gc_interval_s: float = GC_INTERVAL_S, max_completed: int = MAX_COMPLETED,
                 max_live: int = MAX_LIVE, shared: SessionStore | None = None) -> None:
        self.max_bytes, self.ttl_s, self.gc_interval_s = max_bytes, ttl_s, gc_interval_s
        self.shared: SessionStore = shared or MemoryStore()
        self.shared.on_control("cancel", self._cancel_message)
        self.max_completed, self.max_live = max_completed, max_live
        self._sessions: dict[Key, StreamSession] = {}
        self._completed: OrderedDict[Key, StreamSession] = OrderedDict()
        self._detached = detached
        self._running = False

    @staticmethod
    def ttl_from_env() -> float:
        raw = os.environ.get(STREAM_TTL_ENV)
        return float(raw) if raw else TTL_S

    @classmethod
    def from_env(cls, detached: Detached,
                 shared: SessionStore | None = None) -> "StreamRegistry":
        """Upstream's constants, unless a test shortened TTL / sweep."""
        raw = os.environ.get(STREAM_GC_ENV)
        return cls(detached, ttl_s=cls.ttl_from_env(),
                   gc_interval_s=float(raw) if raw else GC_INTERVAL_S, shared=shared)

    # -- lifetime ------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Sweep expired sessions until cancelled; on the way out every
        session is finished so no follower hangs."""
        try:
            self._running = True
            task_status.started()
            while True:
                await trio.sleep(self.gc_interval_s)
                self.sweep()
        finally:
            self._running = False
            for session in self._sessions.values():
                session.finish()
            self._sessions.clear()
            self._completed.clear()

    def sweep(self) -> None:
        cutoff = trio.current_time() - self.ttl_s
        for key, session in list(self._completed.items()):
            if session.ended <= cutoff:
                self._evict(key)

    @property
    def live(self) -> int:
        return len(self._sessions) - len(self._completed)

    # -- sessions ------------------------------------------------------------------

    async def open(self, owner: int, conversation_id: str, handle: JobHandle,
                   frames: AsyncIterator[bytes],
                   resources: RequestResources | None = None,
                   tap: Tap | None = None) -> StreamSession:
        """Install a session whose producer drains `frames` (replacing, and
        stopping, an earlier one with the same key, as upstream, on whichever
        replica owns it); the producer's task takes `handle` over from the
        request's `resources`.  `tap` records the session's token ids and
        its request for the store; a continuation's (takeover.py) resumes
        the session it names instead of opening one."""
        key = (owner, conversation_id)
        running = self._running and self._detached.running
        plan = tap.plan if tap is not None else None
        if plan is not None:
            session = plan.session
            if self._sessions.get(key) is not session or session.done:
                raise ApiError("the continued stream session is gone", "unavailable_error")
            session.tap = tap
            self._detached.start(self._produce, key, session, frames, moving=(handle,),
                                 source=resources, name=f"stream {conversation_id!r}")
            return session
        if not running or (key not in self._sessions and self.live >= self.max_live):
            raise ApiError(f"too many live stream sessions ({self.max_live}); retry when one "
                           "finishes", "unavailable_error")
        try:
            gen, replaced = await self.shared.open_stream(
                owner, conversation_id, tap.request if tap is not None else None)
            if replaced is not None:
                await self.shared.send_control(replaced[0], "cancel", scope=str(owner),
                                               cid=conversation_id, gen=replaced[1])
        except StoreDown:
            raise unavailable(self.shared.shown) from None
        self.cancel(owner, conversation_id)
        session = StreamSession(conversation_id, owner, self.max_bytes)
        session.gen = gen
        session.tap = tap
        self._sessions[key] = session
        self._detached.start(self._produce, key, session, frames, moving=(handle,),
                             source=resources, name=f"stream {conversation_id!r}")
        return session

    async def _produce(self, key: Key, session: StreamSession,
                       frames: AsyncIterator[bytes]) -> None:
        try:
            with session.scope:
                async with aclosing(frames) as it:
                    async for chunk in it:
                        self._append(session, chunk)
        except Exception:  # a renderer bug ends this stream, never the registry
            log.exception("stream session %r failed", session.conversation_id)
        finally:
            # the detached task closes the handle next: a no-op after a
            # natural end, else the disconnect path's Cancel
            self._finish(session)
            if self._sessions.get(key) is session:
                self._completed[key] = session
                while len(self._completed) > self.max_completed:
                    self._evict(next(iter(self._completed)))

    def _append(self, session: StreamSession, chunk: bytes) -> None:
        """The chunk reaches local followers once it is in the store (or the
        store failed), so no client holds a byte the store lacks (the memory
        store hands it on at once)."""
        if session.done or not chunk:
            return
        start, session.queued = session.queued, session.queued + len(chunk)
        tokens = session.tap.take() if session.tap is not None else None
        self.shared.queue(session.gen, session.owner, session.conversation_id, start, chunk,
                          then=lambda ok: session.append(chunk), tokens=tokens)

    def _finish(self, session: StreamSession) -> None:
        if session.handed_off:   # no end entry: another process continues it
            session.finish()
            return
        if session.done:
            return
        self.shared.queue(session.gen, session.owner, session.conversation_id, session.queued,
                          b"", end=True, then=lambda ok: session.finish())

    # -- continued sessions (takeover.py) -----------------------------------------------

    def restore(self, rec) -> StreamSession | None:
        """A session an earlier process left in the store (file_store.Recovered),
        installed with its retained bytes: ended, or live until its
        continuation ends it."""
        key = (rec.scope, rec.cid)
        if key in self._sessions:
            return None
        session = StreamSession(rec.cid, rec.scope, self.max_bytes)
        session.gen, session.queued, session.started_at = rec.gen, rec.total, rec.started_at
        session.preload(rec.first, rec.data)
        self._sessions[key] = session
        if rec.done:
            session.finish()
            session.completed_at = rec.completed_at
            session.ended = trio.current_time() - max(0.0, time.time() - rec.completed_at)
            self._completed[key] = session
        return session

    def hand_off(self) -> int:
        """SIGTERM with a store: stop every live session's producer without
        ending the session in the store, so a peer (or this server after a
        restart) continues it; how many there were."""
        n = 0
        for session in list(self._sessions.values()):
            if self.shared.continues and not session.done:
                session.handed_off = True
                session.scope.cancel()
                n += 1
        return n

    def end_continued(self, session: StreamSession, frame: bytes = b"") -> None:
        """A continuation that will not run: its last frame (an error), then its end."""
        if frame:
            self._append(session, frame)
        self._finish(session)
        key = (session.owner, session.conversation_id)
        if self._sessions.get(key) is session:
            self._completed[key] = session

    def _cancel_message(self, msg: dict[str, str]) -> None:
        """Another replica's DELETE (or replacement) of a session this one owns."""
        try:
            key = (int(msg["scope"]), msg["cid"])
        except (KeyError, ValueError):
            return
        session = self._sessions.get(key)
        if session is not None and session.gen == msg.get("gen"):
            self._evict(key)

    def get(self, owner: int, conversation_id: str) -> StreamSession | None:
        return self._sessions.get((owner, conversation_id))

    def cancel(self, owner: int, conversation_id: str) -> None:
        """Evict and stop (idempotent): upstream's evict_and_cancel."""
        self._evict((owner, conversation_id))

    def _evict(self, key: Key) -> None:
        session = self._sessions.pop(key, None)
        self._completed.pop(key, None)
        if session is not None:
            session.scope.cancel()
            if not session.done:
                self.shared.queue(session.gen, owner_of(key), key[1], session.queued, b"",
                                  drop=True)
            session.finish()

    def lookup(self, owner: int, ids: Iterable[str]) -> list[StreamSession]:
        """For each asked id in order: the session with that exact id and
        every `<id>::<model>` variant.  Nothing not asked about is listed.
        An id asked again adds nothing (upstream lists it again): so the
        answer is bounded by the sessions, not by the request body."""
        by_prefix: dict[str, list[StreamSession]] = {}
        for (o, cid), session in self._sessions.items():
            if o != owner:
                continue
            by_prefix.setdefault(cid, []).append(session)
            parts = cid.split("::")
            for i in range(1, len(parts)):
                by_prefix.setdefault("::".join(parts[:i]), []).append(session)
        return [s for rid in dict.fromkeys(ids) for s in by_prefix.get(rid, ())]


    # -- what the routes call: this replica's sessions, then the shared store's ----------

    async def follower(self, owner: int, conversation_id: str,
                       raw_from: str) -> AsyncIterator[bytes] | None:
        """The bytes from offset `raw_from` on, then live ones; None for an
        unknown id (checked before the offset, as upstream)."""
        session = self.get(owner, conversation_id)
        if session is not None:
            offset = _parse_from(raw_from) if raw_from else 0
            if offset < session.dropped:
                raise _bad("Stream offset lost, please restart")
            return session.follow(offset)
        try:   # another replica's session, read from the shared store
            remote = await self.shared.describe(owner, conversation_id)
            if remote is None:
                return None
            offset = _parse_from(raw_from) if raw_from else 0
            if offset < await self.shared.first_offset(owner, remote):
                raise _bad("Stream offset lost, please restart")
        except StoreDown:
            raise unavailable(self.shared.shown) from None
        return self.shared.follow(remote, owner, offset)

    async def describe(self, owner: int, ids: list[str]) -> list[StreamSession | RemoteSession]:
        """`lookup`, plus other replicas' sessions (when the store answers)."""
        found: list[StreamSession | RemoteSession] = list(self.lookup(owner, ids))
        if ids:
            local = {s.conversation_id for s in found}
            try:
                remote = await self.shared.lookup(owner, ids)
            except StoreDown:
                remote = []   # the store is down: what this replica holds
            found += [s for s in remote if s.conversation_id not in local]
        return found

    async def continuing(self, owner: int, conversation_id: str) -> bool:
        """Whether the session is live, here or on a live replica, or will be
        continued by a takeover (a store that cannot answer: assumed so)."""
        session = self.get(owner, conversation_id)
        if session is not None:
            return not session.done
        try:
            remote = await self.shared.describe(owner, conversation_id)
        except StoreDown:
            return True
        return remote is not None and not remote.done

    async def stop(self, owner: int, conversation_id: str) -> None:
        """DELETE: evict here, and in the store, asking the replica that
        generates it (when another) to stop it."""
        self.cancel(owner, conversation_id)
        try:
            other = await self.shared.delete_stream(owner, conversation_id)
            if other is not None:
                await self.shared.send_control(other[0], "cancel", scope=str(owner),
                                               cid=conversation_id, gen=other[1])
        except StoreDown:
            raise unavailable(self.shared.shown) from None


def owner_of(key: Key) -> int:
    return key[0]


# -- the request side ---------------------------------------------------------------

async def sse_response(registry: StreamRegistry, resources: RequestResources,
                       handle: JobHandle, frames: AsyncIterator[bytes],
                       tap: Tap | None = None) -> Response:
    """The response of every streaming route (surfaces/streaming.py).
    Without the header: the frames themselves, cancelled with the request.
    With it: the frames go to a session that outlives the request (taking
    the handle off the request's `resources`), and the response follows it."""
    conversation_id = request.headers.get(HEADER, "")
    if not conversation_id:
        return Response(frames, content_type=SSE_TYPE)
    if not _VALID_ID.fullmatch(conversation_id):
        handle.close()
        raise ApiError(f"Invalid {HEADER} header: expected 1 to {MAX_ID_CHARS} printable "
                       "ASCII characters without spaces")
    if tap is not None and tap.plan is None:
        tap.record(request_record(request, await request.get_data(), key_scope(),
                                  request_tape.current()))
    try:
        session = await registry.open(key_scope(), conversation_id, handle, frames, resources,
                                      tap)
    except ApiError:
        handle.close()
        raise
    return Response(session.follow(0), content_type=SSE_TYPE)


def _bad(message: str) -> ApiError:
    return ApiError(message, "invalid_request_error")


def _parse_from(raw: str) -> int:
    """std::stoull's reading: leading space, a sign, digits, trailing junk
    ignored; a negative value wraps; no digits or overflow is refused."""
    m = _FROM.match(raw)
    if not m or int(m.group(2)) >= _U64:
        raise _bad("Invalid 'from' offset")
    value = int(m.group(2))
    return (_U64 - value) % _U64 if m.group(1) == "-" else value


async def get_stream(registry: StreamRegistry) -> Response:
    """GET /v1/stream?conv_id=<id>&from=N: replay from N, then follow."""
    conversation_id = request.args.get("conv_id", "")
    if not conversation_id:
        raise _bad("Missing conversation id in path")
    follower = await registry.follower(key_scope(), conversation_id,
                                       request.args.get("from", ""))
    if follower is None:
        return not_found()   # upstream's 404 handler answers "File Not Found"
    return Response(follower, content_type=SSE_TYPE)


async def lookup_streams(registry: StreamRegistry) -> Response:
    """POST /v1/streams/lookup {"conversation_ids": [...]}."""
    try:
        body = await read_json_body(request)
    except ApiError as err:
        return json_response({"error": {"message": f"invalid body: {err.message}",
                                        "type": "invalid_request_error"}}, 400)
    ids = body.get("conversation_ids") if isinstance(body, dict) else None
    wanted = [i for i in ids if isinstance(i, str) and i] if isinstance(ids, list) else []
    return json_response([
        {"conversation_id": s.conversation_id, "is_done": s.done,
         "total_bytes": s.total_bytes, "started_at": s.started_at,
         "completed_at": s.completed_at}
        for s in await registry.describe(key_scope(), wanted)])


async def delete_stream(registry: StreamRegistry) -> Response:
    """DELETE /v1/stream?conv_id=<id>: the explicit Stop; always 204."""
    conversation_id = request.args.get("conv_id", "")
    if not conversation_id:
        raise _bad("Missing conversation id in path")
    await registry.stop(key_scope(), conversation_id)
    return Response("", status=204, content_type="application/json")

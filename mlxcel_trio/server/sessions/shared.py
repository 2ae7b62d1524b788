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
    t:<scope>:<id>:<gen>  the session's token ids, one JSON entry per chunk
                      (takeover.py; never trimmed)
    r:<replica>       the owner's heartbeat; absent: the owner is gone, and
                      a live replica takes its sessions over (TAKEOVER:
                      the hash's replica, epoch and attempts; req holds
                      the request record); one without a record ends.
                      Each replica names its connections (CLIENT SETNAME
                      mlxcel-<replica>): a peer whose key has not lapsed
                      but which holds no connection died (the kernel
                      closed its sockets), and its key is dropped at the
                      next claim scan instead of waiting out the TTL
    c:<replica>       the owner's control stream: cancel a stream, force a
                      reasoning end, cancel a background response
    cc:<id>           a controllable completion: owner, scope, armed
    resp:<scope>:<id> a stored response (JSON)

Durability.  A chunk reaches the local followers only after it is in the
store, so a client never holds a byte the store lacks: a replica killed
mid-stream loses nothing it had sent.  One writer task flushes every
session's pending chunks in one pipelined round trip, so a busy replica
pays one round trip per flush, not per frame.

Rooms.  `SharedStore` is assembled from one class per concern:
store_transport.py (calls and backoff), store_heartbeat.py, store_control.py
(the control bus), store_streams.py (the stream log), store_records.py
(controllable completions, stored responses).

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

import logging
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import trio

from ... import store_url
from .store_control import ControlBus
from .store_heartbeat import Heartbeat
from .store_records import RESPONSE_TTL_ENV, RESPONSE_TTL_S, CompletionRecords, ResponseRecords
from .store_streams import APPEND, CLAIM, REMOVE, TAKEOVER, Pending, StreamLog, \
    connection_name
from .store_transport import BLOCK_MS, THREADS, StoreDown, Transport, seconds_from_env

log = logging.getLogger("mlxcel.session_store")

REPLICA_TTL_S = 10.0          # a silent owner counts as gone after this
REPLICA_TTL_ENV = "MLXCEL_INTERNAL_REPLICA_TTL_S"       # tests only


class SharedStore(Transport, Heartbeat, ControlBus, StreamLog, CompletionRecords,
                  ResponseRecords):
    continues = True   # a peer claims a gone owner's sessions (takeover.py)

    def __init__(self, url: str, *, stream_ttl_s: float, max_bytes: int) -> None:
        import redis  # optional dependency: the `redis` extra

        self.url = url
        self.shown = store_url.redacted(url)
        self.replica = uuid.uuid4().hex[:16]
        self.stream_ttl_ms = int(stream_ttl_s * 1000)
        self.response_ttl_ms = int(seconds_from_env(RESPONSE_TTL_ENV, RESPONSE_TTL_S) * 1000)
        self.replica_ttl_s = seconds_from_env(REPLICA_TTL_ENV, REPLICA_TTL_S)
        self.max_bytes = max_bytes
        self._errors = (redis.exceptions.RedisError, OSError)
        self._refused = redis.exceptions.ResponseError
        self._redis = redis.Redis.from_url(
            store_url.client_url(url), socket_timeout=BLOCK_MS / 1000 + 5,
            socket_connect_timeout=2, max_connections=THREADS + 8,
            client_name=connection_name(self.replica))
        self._append = self._redis.register_script(APPEND)
        self._claim = self._redis.register_script(CLAIM)
        self._remove = self._redis.register_script(REMOVE)
        self._takeover = self._redis.register_script(TAKEOVER)
        self._limiter = trio.CapacityLimiter(THREADS)
        self._down_until = 0.0          # trio clock
        self._backoff = 0.0
        self._was_down = False
        self._released = False          # SIGTERM handed the sessions off: no more beats
        self._no_client_list = False    # the store refused CLIENT LIST (store_streams.py)
        self._flushing = False          # the writer has a batch in flight
        self._pending: OrderedDict[str, Pending] = OrderedDict()   # by session gen
        self._wake = trio.Event()
        self._handlers: dict[str, Callable[[dict[str, str]], None]] = {}
        self._ticks: list[Callable[[], None]] = []
        self._deferred_send, self._deferred = trio.open_memory_channel[
            Callable[[], Awaitable[None]]](1024)

    # -- lifetime ------------------------------------------------------------------------

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

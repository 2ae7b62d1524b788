"""The file session store: `--session-store file://DIR`, one server's stream
sessions kept on local disk so a restarted server continues them.

Theory of operation.  Every resumable stream (X-Conversation-Id) is one
append-only log file, `DIR/<digest of scope and id>.log`, of records:

    o  the session opened: scope, id, gen, start time and the request
       record a continuation rebuilds it from (sessions/takeover.py)
    d  a published chunk: its byte offset, its bytes, and the token ids of
       each job whose frames it carries
    c  a continuation claimed the session (counts the bounded attempts)
    e  the session ended (its completion time)

Each record is one JSON header line followed by its payload bytes.  A
session's log is removed when the session is (DELETE, replacement, the end
of its retention).  When a server starts, `recovered()` reads every log in
DIR: ended sessions are served again until their retention ends, and
unfinished ones are continued by the takeover (sessions/takeover.py).

Bounds.  A log past twice the per-session byte cap is compacted: rewritten
(to a temporary file, then renamed over it) as its open record, one chunk
holding the retained tail, and every token id.  So a log holds at most
about 2 x 4 MiB plus its token ids.  Ended sessions' logs are deleted once
their retention (300 s) has passed.

Durability (the fsync policy).  The writer hands every chunk to the
operating system before the chunk reaches any client (as the Redis store
does), so a killed server (SIGKILL, OOM) loses nothing a client saw.  Open
and end records are fsync'd at once; chunks are fsync'd at most once per
FSYNC_S, so a machine crash (power loss) loses at most the last second.

Stored responses (`store` on /v1/responses: response_store.py) are one
JSON file each, DIR/responses/<digest of scope and id>.json, written to a
temporary file, fsync'd and renamed over the old one, so a restarted
server answers GET /v1/responses/:id and `previous_response_id` for what
the killed one stored (a background run's entry included: its run is a
stream session here, continued as the others).  A write reaches the disk
before the chunks queued after it (`defer`: the writer runs publications
first).  Bounds: at most MAX_RESPONSE_FILES files (the oldest written is
removed first) and each is removed once RESPONSE_TTL_S (30 days, as the
Redis store) passed since its last write.

One server per DIR: the server holds an exclusive lock on DIR/lock while
it runs, and a second one is refused at startup (store_url.file_problem).
Control entries are not kept here: they stay in the process, as with
`memory` (memory_store.LocalPeers).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import attrs
import trio

from ... import store_url
from .memory_store import LocalPeers
from .store_records import RESPONSE_TTL_ENV, RESPONSE_TTL_S
from .store_streams import Pending, Recovered, applied, enqueue
from .store_transport import seconds_from_env

log = logging.getLogger("mlxcel.session_store")

FSYNC_S = 1.0
SUFFIX = ".log"
RESPONSES = "responses"         # DIR/responses: the stored responses
MAX_RESPONSE_FILES = 4096       # stored responses kept on disk at most


def _header(kind: str, payload: bytes = b"", **fields) -> bytes:
    return json.dumps({"k": kind, "n": len(payload), **fields},
                      separators=(",", ":")).encode() + b"\n" + payload + b"\n"


def read_log(path: str, max_bytes: int) -> Recovered | None:
    """A log's session, or None when it is unreadable (a torn last record
    is ignored: it was never fully handed to the system)."""
    with open(path, "rb") as f:
        raw = f.read()
    pos, rec = 0, None
    while pos < len(raw):
        nl = raw.find(b"\n", pos)
        if nl < 0:
            break
        try:
            head = json.loads(raw[pos:nl])
        except ValueError:
            break
        n = int(head.get("n", 0))
        payload = raw[nl + 1:nl + 1 + n]
        if len(payload) < n or raw[nl + 1 + n:nl + 2 + n] != b"\n":
            break   # torn
        pos = nl + 2 + n
        if rec is not None:
            rec.length = pos
        kind = head.get("k")
        if kind == "o":
            rec = Recovered(int(head["scope"]), head["cid"], head["gen"],
                            int(head.get("started_at", 0)), head.get("req"), length=pos)
        elif rec is None:
            return None
        elif kind == "d":
            at = int(head["at"])
            if at != rec.total:   # a gap: keep what is contiguous
                if not rec.data and at > rec.first:
                    rec.first = at
                else:
                    break
            rec.data += payload
            if len(rec.data) > max_bytes:
                cut = len(rec.data) - max_bytes
                del rec.data[:cut]
                rec.first += cut
            for i, toks in enumerate(head.get("t") or ()):
                while len(rec.tokens) <= i:
                    rec.tokens.append([])
                rec.tokens[i].extend(toks)
        elif kind == "c":
            rec.attempts = int(head.get("a", rec.attempts + 1))
        elif kind == "e":
            rec.done, rec.completed_at = True, int(head.get("completed_at", 0))
    return rec


class FileStore(LocalPeers):
    """`SessionStore` on local disk (see the module docstring); no peers."""

    continues = True   # a restart on DIR continues its unfinished sessions

    def __init__(self, url: str, *, stream_ttl_s: float, max_bytes: int) -> None:
        self.url = url
        self.shown = store_url.redacted(url)
        self.dir = store_url.file_dir(url)
        self.replica = uuid.uuid4().hex[:16]
        self.stream_ttl_s = stream_ttl_s
        self.max_bytes = max_bytes
        self._lock_fd: int | None = None
        self._files: dict[str, object] = {}        # gen -> open log file
        self._paths: dict[str, str] = {}           # gen -> path
        self._ended: dict[str, float] = {}         # path -> time.time() it ended
        self._pending: OrderedDict[str, Pending] = OrderedDict()
        self._opened: dict[str, bytes] = {}        # gen -> its open record, not yet written
        self._wake = trio.Event()
        self._ticks: list[Callable[[], None]] = []
        self._last_sync = 0.0
        self._flushing = False                     # the writer has a batch in flight
        self._recovered: list[Recovered] = []
        self._deferred: list[Callable[[], Awaitable[None]]] = []   # run before each batch
        self._responses: OrderedDict[str, float] = OrderedDict()   # path -> written, oldest first
        self.response_ttl_s = seconds_from_env(RESPONSE_TTL_ENV, RESPONSE_TTL_S)

    @property
    def up(self) -> bool:
        return True

    # -- lifetime ------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        os.makedirs(self.dir, exist_ok=True)
        fd = os.open(os.path.join(self.dir, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise RuntimeError(f"--session-store {self.shown}: another server uses this "
                               "directory") from None
        self._lock_fd = fd
        self._recovered = await trio.to_thread.run_sync(self._recover)
        await trio.to_thread.run_sync(self._index_responses)
        log.info("session store %s: %d session(s) recovered", self.shown, len(self._recovered))
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer)
                nursery.start_soon(self._ticker)
                task_status.started()
        finally:
            for f in self._files.values():
                f.close()
            self._files.clear()
            os.close(fd)
            self._lock_fd = None

    def _recover(self) -> list[Recovered]:
        out, now = [], time.time()
        for name in sorted(os.listdir(self.dir)):
            if not name.endswith(SUFFIX):
                continue
            path = os.path.join(self.dir, name)
            try:
                rec = read_log(path, self.max_bytes)
            except (OSError, ValueError, KeyError, TypeError):
                rec = None
            if rec is None or (rec.done and now - rec.completed_at > self.stream_ttl_s):
                _unlink(path)
                continue
            if rec.length < os.path.getsize(path):
                os.truncate(path, rec.length)   # a torn last record: appends follow the whole ones
            self._paths[rec.gen] = path
            if rec.done:
                self._ended[path] = rec.completed_at
            out.append(rec)
        return out

    def recovered(self) -> list[Recovered]:
        """The sessions an earlier server left in DIR (read once, at run)."""
        out, self._recovered = self._recovered, []
        return out

    async def _ticker(self) -> None:
        while True:
            await trio.sleep(max(1.0, min(60.0, self.stream_ttl_s / 5)))
            for tick in self._ticks:
                tick()
            cutoff = time.time() - self.stream_ttl_s
            for path, ended in list(self._ended.items()):
                if ended <= cutoff:
                    del self._ended[path]
                    _unlink(path)
            cutoff = time.time() - self.response_ttl_s
            while self._responses and next(iter(self._responses.values())) <= cutoff:
                _unlink(self._responses.popitem(last=False)[0])

    # -- heartbeat and control: one server, no peers --------------------------------------

    async def release(self) -> None:
        """SIGTERM's hand-off: every queued chunk written (and synced), so a
        restart on this directory continues the sessions left unfinished."""
        with trio.move_on_after(10.0):
            await trio.sleep(0.05)   # the producers just cancelled queue their last chunks
            while self._pending or self._deferred or self._flushing:
                await trio.sleep(0.01)
        self._last_sync = 0.0

    def on_tick(self, fn: Callable[[], None]) -> None:
        self._ticks.append(fn)

    def defer(self, fn: Callable[[], Awaitable[None]]) -> None:
        """A publication (a stored response) the writer runs before the
        chunks queued after it."""
        self._deferred.append(fn)
        self._wake.set()

    # -- stored responses -------------------------------------------------------------------

    def _response_path(self, scope: str, rid: str) -> str:
        digest = hashlib.sha256(f"{scope}\0{rid}".encode()).hexdigest()[:40]
        return os.path.join(self.dir, RESPONSES, digest + ".json")

    def _index_responses(self) -> None:
        """Worker thread, at startup: the files an earlier server left, by age."""
        folder = os.path.join(self.dir, RESPONSES)
        os.makedirs(folder, exist_ok=True)
        found = []
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if name.endswith(".tmp"):
                _unlink(path)
            elif name.endswith(".json"):
                found.append((os.path.getmtime(path), path))
        self._responses = OrderedDict((path, t) for t, path in sorted(found))

    async def put_response(self, scope: str, rid: str, record: dict) -> None:
        data = json.dumps({**record, "replica": self.replica},
                          separators=(",", ":")).encode()
        path = self._response_path(scope, rid)
        try:
            await trio.to_thread.run_sync(_replace, path, data)
        except OSError as exc:
            log.warning("session store %s: a stored response was not written (%s)",
                        self.shown, exc)
            return
        self._responses.pop(path, None)
        self._responses[path] = time.time()
        while len(self._responses) > MAX_RESPONSE_FILES:
            _unlink(self._responses.popitem(last=False)[0])

    async def get_response(self, scope: str, rid: str) -> dict | None:
        path = self._response_path(scope, rid)
        written = self._responses.get(path)
        if written is None or time.time() - written > self.response_ttl_s:
            return None
        try:
            raw = await trio.to_thread.run_sync(_read, path)
            return json.loads(raw)
        except (OSError, ValueError):
            return None

    # -- the stream log ---------------------------------------------------------------------

    def _path(self, scope: int, cid: str) -> str:
        digest = hashlib.sha256(f"{scope}\0{cid}".encode()).hexdigest()[:40]
        return os.path.join(self.dir, digest + SUFFIX)

    async def open_stream(self, scope: int, cid: str, record: dict | None = None
                          ) -> tuple[str, tuple[str, str] | None]:
        gen = uuid.uuid4().hex
        for old, path in list(self._paths.items()):   # the session it replaces
            if path == self._path(scope, cid):
                self.queue(old, scope, cid, 0, b"", drop=True)
        self._paths[gen] = self._path(scope, cid)
        self._opened[gen] = _header("o", scope=scope, cid=cid, gen=gen,
                                    started_at=int(time.time()), req=record)
        return gen, None

    def claim(self, rec: Recovered) -> int:
        """A continuation of `rec` starts: its attempt number (1, 2, ...)."""
        rec.attempts += 1
        self._opened[rec.gen] = _header("c", a=rec.attempts)
        self._paths[rec.gen] = self._path(rec.scope, rec.cid)
        self._pending.setdefault(rec.gen, Pending(rec.gen, rec.scope, rec.cid, rec.total))
        self._wake.set()
        return rec.attempts

    def queue(self, gen: str, scope: int, cid: str, start: int, data: bytes, *,
              end: bool = False, drop: bool = False,
              then: Callable[[bool], None] | None = None,
              tokens: list[list[int]] | None = None) -> None:
        enqueue(self._pending, gen, scope, cid, start, data, end, drop, then, tokens)
        self._wake.set()

    async def _writer(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            # publications first: one queued before a chunk lands before it
            deferred, self._deferred = self._deferred, []
            self._flushing = bool(deferred)
            for fn in deferred:
                try:
                    await fn()
                except Exception:  # a bad publication never stops the writer
                    log.exception("session store: a queued publication failed")
            self._flushing = False
            batch, self._pending = list(self._pending.values()), OrderedDict()
            if not batch:
                continue
            work = [(p, self._opened.pop(p.gen, None)) for p in batch]
            ok = True
            try:
                self._flushing = True
                await trio.to_thread.run_sync(self._flush, work)
            except OSError as exc:
                ok = False
                log.warning("session store %s: a write failed (%s)", self.shown, exc)
            finally:
                self._flushing = False
            applied(batch, ok)

    def _flush(self, work) -> None:
        """Worker thread: append each session's records; fsync by the policy."""
        now = time.monotonic()
        periodic = now - self._last_sync >= FSYNC_S
        for p, opened in work:
            path = self._paths.get(p.gen)
            if path is None:
                continue
            if p.drop:
                f = self._files.pop(p.gen, None)
                if f is not None:
                    f.close()
                self._paths.pop(p.gen, None)
                self._ended.pop(path, None)
                _unlink(path)
                continue
            f = self._files.get(p.gen)
            if f is None:
                f = self._files[p.gen] = open(path, "ab")
            out = bytearray(opened or b"")
            if p.data:
                out += _header("d", bytes(p.data), at=p.start, t=p.tokens or None)
            if p.end:
                out += _header("e", completed_at=int(time.time()))
            f.write(out)
            f.flush()
            if opened or p.end or periodic:
                os.fsync(f.fileno())
            if p.end:
                f.close()
                del self._files[p.gen]
                self._ended[path] = time.time()
            elif f.tell() > 2 * self.max_bytes + 65536:
                f.close()
                del self._files[p.gen]
                _compact(path, self.max_bytes)
        if periodic:
            self._last_sync = now


def _compact(path: str, max_bytes: int) -> None:
    """Rewrite a log as its open record, its retained tail and its ids."""
    rec = read_log(path, max_bytes)
    if rec is None:
        return
    out = _header("o", scope=rec.scope, cid=rec.cid, gen=rec.gen,
                  started_at=rec.started_at, req=rec.request)
    if rec.attempts:
        out += _header("c", a=rec.attempts)
    out += _header("d", bytes(rec.data), at=rec.first, t=rec.tokens or None)
    if rec.done:
        out += _header("e", completed_at=rec.completed_at)
    _replace(path, out)


def _replace(path: str, data: bytes) -> None:
    """Worker thread: `path` holds `data` whole, or what it held before."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

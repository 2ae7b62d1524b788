"""The prompt cache's disk tier (--cache-disk DIR): entries that survive a
restart.

Rules:
- One entry is one safetensors file, `<sha256 of its bytes>.safetensors`:
  a `tokens` tensor (int32, the entry's token run, which is its place in
  the token trie) and each layer's arrays as `L<i>.<name>`; the metadata
  carries the format tag, the namespace, the layer layout (cache kind per
  layer, which must equal this model's) and each layer's own fields.
- Every entry the memory tier stores is written through (so an entry the
  memory tier evicts later is already here, and a killed server loses
  nothing it had cached); the directory is bounded by its own byte budget,
  oldest file (by modification time, refreshed on a hit) deleted first.
- At start the directory is indexed from the files' headers and token
  tensors only; the arrays load on a hit, after the whole file's checksum
  matches its name.  A file that is not ours, truncated, corrupt, of
  another format version or of another model's layout is skipped with one
  log line and left where it is; only files this tier wrote count against
  the budget or get deleted.
- Writes go to a temporary name in the same directory, then rename.

Threads: the tier belongs to the engine thread, except the writing.  `put`
only gathers the entry's arrays (evaluated there, contiguous: the memory
tier's own arrays, or copies of views into them) and hands them to a
background writer through a bounded queue; the writer serializes them
(safetensors, laid out here over the arrays' own buffers, so the writer
never calls into MLX), hashes while it writes, renames, and posts the finished entry back.
The engine thread takes finished entries into its index (and evicts) at its
next call.  When WRITE_QUEUE entries are already waiting, a new one is not
written (counted as `write_dropped`): decoding never waits for the disk.
`close` lets the queue drain (bounded) at shutdown.  The writer thread
starts on demand and ends after WRITER_IDLE_S without work, so a tier that
an idle sleep drops leaves no thread behind.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import re
import struct
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from . import cache_kinds

log = logging.getLogger("mlxcel.engine.cache")

FORMAT = "mlxcel-prompt-cache/1"
_NAME = re.compile(r"^[0-9a-f]{64}\.safetensors$")
WRITE_QUEUE = 4        # entries handed over and not yet written, at most
WRITER_IDLE_S = 5.0    # the writer thread ends after this long without work
CLOSE_WAIT_S = 30.0    # what shutdown waits for the queue to drain
WRITER_NICE = 10       # the writer thread's niceness above the engine's (Linux)


class DiskEntry:
    __slots__ = ("path", "ns", "tokens", "cuttable", "nbytes")

    def __init__(self, path: Path, ns: str, tokens: np.ndarray, cuttable: bool,
                 nbytes: int) -> None:
        self.path = path
        self.ns = ns
        self.tokens = tokens
        self.cuttable = cuttable
        self.nbytes = nbytes


def disk_tier(root: str | None, mib: int, lockstep=None) -> DiskTier | None:
    """--cache-disk's tier, or None: not asked for, or ranks in lockstep
    (each holds its own share of the KV; one directory cannot serve them)."""
    if root is None:
        return None
    if lockstep is not None:
        log.warning("--cache-disk: off while several ranks serve one model")
        return None
    return DiskTier(root, None if mib < 0 else mib * 1024 * 1024)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class DiskTier:
    """Files of one model's prompt-cache entries under `root`, at most
    `budget_bytes` of them (None: no limit)."""

    def __init__(self, root: str | Path, budget_bytes: int | None,
                 background: bool = True) -> None:
        self.root = Path(root)
        self.budget = budget_bytes
        self.layout = ""
        self._entries: dict[str, DiskEntry] = {}   # by file name, oldest first
        self.skipped = 0
        self.write_dropped = 0
        # False: put() writes on the calling thread (what bench/cache_disk_write.py
        # compares against)
        self.background = background
        self._pending: queue.Queue[_Write] = queue.Queue(WRITE_QUEUE)
        self._done: queue.SimpleQueue[tuple[_Write, Path | None]] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._lock = threading.Lock()

    def open(self, layout: str) -> None:
        """Index the directory for a model whose layers are `layout`
        (`cache_kinds.layout_of`); the scheduler calls this once it knows them."""
        self.layout = layout
        self.root.mkdir(parents=True, exist_ok=True)
        self._entries.clear()
        self._index()

    # -- index ------------------------------------------------------------------

    def _index(self) -> None:
        found = []
        for path in sorted(self.root.iterdir()):
            if path.name.startswith(".") or not path.is_file():
                continue
            entry, why = self._read_header(path)
            if entry is None:
                self.skipped += 1
                log.warning("prompt cache disk: skipping %s: %s", path.name, why)
                continue
            found.append((path.stat().st_mtime, entry))
        for _, entry in sorted(found, key=lambda f: f[0]):
            self._entries[entry.path.name] = entry
        log.info("prompt cache disk: %d entries (%d bytes) in %s", len(self._entries),
                 self.nbytes, self.root)
        self._evict()

    def _read_header(self, path: Path) -> tuple[DiskEntry | None, str]:
        from safetensors import safe_open

        if not _NAME.match(path.name):
            return None, "not a prompt-cache file (name)"
        try:
            with safe_open(str(path), framework="numpy") as f:
                meta = f.metadata() or {}
                if meta.get("format") != FORMAT:
                    return None, f"format {meta.get('format')!r}, expected {FORMAT!r}"
                if meta.get("layout") != self.layout:
                    return None, "written for a model with other cache layers"
                tokens = np.asarray(f.get_tensor("tokens"), dtype=np.int64)
        except Exception as e:  # truncated, corrupt header, not safetensors at all
            return None, f"unreadable ({type(e).__name__}: {e})"
        return DiskEntry(path, meta["ns"], tokens, meta.get("cuttable") == "1",
                         path.stat().st_size), ""

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def stats(self) -> dict[str, int]:
        self._collect()
        return {"entries": len(self._entries), "bytes": self.nbytes,
                "write_dropped": self.write_dropped}

    # -- lookup -------------------------------------------------------------------

    def best(self, ns: str, prompt: np.ndarray, limit: int) -> tuple[int, DiskEntry] | None:
        """The entry supplying the most of `prompt`, as (n, entry)."""
        from .prompt_cache import usable

        self._collect()
        best = None
        for e in self._entries.values():
            if e.ns != ns:
                continue
            n = usable(e.tokens, e.cuttable, prompt, limit)
            if n > 0 and (best is None or n >= best[0]):
                best = (n, e)
        return best

    def load(self, entry: DiskEntry) -> list | None:
        """The entry's layers, or None (logged, dropped from the index) when
        the file is gone or its bytes no longer match their checksum."""
        import mlx.core as mx

        name = entry.path.name
        try:
            if _sha256(entry.path) != name.split(".")[0]:
                raise ValueError("checksum mismatch")
            arrays, meta = mx.load(str(entry.path), return_metadata=True)
            specs = json.loads(meta["layers"])
            layers = []
            for i, (kind, fields) in enumerate(specs):
                prefix = f"L{i}."
                own = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
                layers.append(cache_kinds.BY_NAME[kind].restore(own, fields))
        except Exception as e:
            log.warning("prompt cache disk: skipping %s: %s", name, e)
            self._entries.pop(name, None)
            self.skipped += 1
            return None
        os.utime(entry.path)
        self._entries[name] = self._entries.pop(name)   # most recently used last
        return layers

    # -- writing ----------------------------------------------------------------

    def put(self, ns: str, tokens: np.ndarray, layers: list, cuttable: bool) -> None:
        """Hand one entry to the writer (unless it is WRITE_QUEUE behind).
        Engine thread: evaluates the arrays it hands over, writes nothing."""
        import mlx.core as mx

        self._collect()
        if self.background and self._pending.full():
            self.write_dropped += 1
            log.debug("prompt cache disk: writer %d entries behind, not writing one of %d "
                      "tokens", WRITE_QUEUE, len(tokens))
            return
        tensors, meta = entry_tensors(ns, tokens, layers, cuttable)
        # row-contiguous and evaluated: the writer reads their buffers as they are
        tensors = {k: mx.contiguous(v) for k, v in tensors.items()}
        mx.eval(list(tensors.values()))
        job = _Write(ns, tokens, cuttable, *_serialized(tensors, meta))
        if not self.background:
            self._finish(*self._write(job))
            return
        self._pending.put_nowait(job)
        self._ensure_writer()

    def _ensure_writer(self) -> None:
        with self._lock:
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(target=self._write_loop, daemon=True,
                                                name="prompt-cache-disk-writer")
                self._writer.start()

    def _write_loop(self) -> None:
        try:   # Linux: a thread's own niceness; where cores are few, decoding goes first
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid,
                           min(19, os.getpriority(os.PRIO_PROCESS, tid) + WRITER_NICE))
        except (AttributeError, OSError):
            pass
        while True:
            try:
                job = self._pending.get(timeout=WRITER_IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._pending.empty():   # a put racing this exit restarts the writer
                        self._writer = None
                        return
                continue
            try:
                self._done.put(self._write(job))
            finally:
                self._pending.task_done()

    def _write(self, job: _Write) -> tuple[_Write, Path | None]:
        """Writer thread (or the caller when not in the background): the
        file, under the digest of its bytes; None when it could not be
        written."""
        fd, tmp = tempfile.mkstemp(prefix=".write-", suffix=".safetensors", dir=self.root)
        try:
            with os.fdopen(fd, "wb") as f:
                digest = _write_safetensors(f, job.head, job.views)
            path = self.root / f"{digest}.safetensors"
            if not path.exists():
                os.replace(tmp, path)
            return job, path
        except Exception as e:  # noqa: BLE001 - a full disk, a dying device: the tier goes on
            log.warning("prompt cache disk: could not write an entry: %s", e)
            return job, None
        finally:
            job.head, job.views = b"", []   # the arrays may go once the memory tier lets go
            if os.path.exists(tmp):
                os.unlink(tmp)

    def _collect(self) -> None:
        """Take the entries the writer finished into the index (engine thread)."""
        while True:
            try:
                done = self._done.get_nowait()
            except queue.Empty:
                return
            self._finish(*done)

    def _finish(self, job: _Write, path: Path | None) -> None:
        if path is None or path.name in self._entries:
            return
        try:
            size = path.stat().st_size
        except OSError:   # deleted since (another server's budget): nothing to index
            return
        self._entries[path.name] = DiskEntry(path, job.ns, job.tokens, job.cuttable, size)
        self._evict()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every handed-over entry is written and indexed;
        whether that happened within `timeout` seconds."""
        done = threading.Event()

        def wait() -> None:
            self._pending.join()
            done.set()

        threading.Thread(target=wait, daemon=True).start()
        ok = done.wait(timeout)
        self._collect()
        return ok

    def close(self) -> None:
        """At shutdown: let the writer finish what it was handed (bounded)."""
        if not self.flush(CLOSE_WAIT_S):
            log.warning("prompt cache disk: %d entries not written after %.0f s at shutdown",
                        self._pending.qsize(), CLOSE_WAIT_S)

    def _evict(self) -> None:
        if self.budget is None:
            return
        while self._entries and self.nbytes > self.budget:
            name = next(iter(self._entries))
            entry = self._entries.pop(name)
            log.debug("prompt cache disk: evicting %s (%d bytes)", name, entry.nbytes)
            try:
                entry.path.unlink()
            except OSError:
                pass


class _Write:
    """One entry on its way to the disk: evaluated, contiguous arrays."""

    __slots__ = ("ns", "tokens", "cuttable", "head", "views")

    def __init__(self, ns: str, tokens: np.ndarray, cuttable: bool, head: bytes,
                 views: list) -> None:
        self.ns, self.tokens, self.cuttable = ns, tokens, cuttable
        self.head, self.views = head, views


# MLX dtype names -> safetensors' (the ones a cache holds, and a few more)
_ST_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
              "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
              "uint8": "U8", "uint16": "U16", "uint32": "U32", "uint64": "U64",
              "bool": "BOOL"}


def _serialized(tensors: dict[str, Any], meta: dict[str, str]) -> tuple[bytes, list]:
    """A safetensors file of `tensors` (evaluated, row-contiguous mx.arrays)
    and `meta`, as its header bytes and one byte view per tensor (the
    arrays' own memory: an mx.array exposes it as a buffer).  Engine
    thread; the writer then only writes and hashes Python buffers."""
    header: dict[str, Any] = {"__metadata__": meta}
    views, at = [], 0
    for name in sorted(tensors):
        a = tensors[name]
        n = a.nbytes
        header[name] = {"dtype": _ST_DTYPES[str(a.dtype).rsplit(".", 1)[-1]],
                        "shape": list(a.shape), "data_offsets": [at, at + n]}
        if n:
            views.append(memoryview(a).cast("B"))   # any format, bfloat16 too
        at += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)   # the data starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw, views


def entry_tensors(ns: str, tokens, layers: list, cuttable: bool) -> tuple[dict, dict]:
    """One entry as the file holds it: the token tensor and each layer's
    arrays by name, and the metadata that says how to read them back."""
    import mlx.core as mx

    tensors = {"tokens": mx.array(tokens.astype(np.int32))}
    specs = []
    for i, c in enumerate(layers):
        kind = cache_kinds.kind_of(c)
        arrays, fields = kind.arrays(c)
        tensors.update({f"L{i}.{k}": v for k, v in arrays.items()})
        specs.append((kind.name, fields))
    meta = {"format": FORMAT, "ns": ns, "layout": cache_kinds.layout_of(layers),
            "cuttable": "1" if cuttable else "0", "layers": json.dumps(specs)}
    return tensors, meta


def _write_safetensors(f, head: bytes, views: list) -> str:
    """Write a `_serialized` file to `f`; the sha256 of its bytes."""
    h = hashlib.sha256(head)
    f.write(head)
    for view in views:
        h.update(view)
        f.write(view)
    return h.hexdigest()

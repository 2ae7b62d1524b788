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

Engine thread only; nothing here runs per decode step.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from pathlib import Path

import numpy as np

from . import cache_kinds

log = logging.getLogger("mlxcel.engine.cache")

FORMAT = "mlxcel-prompt-cache/1"
_NAME = re.compile(r"^[0-9a-f]{64}\.safetensors$")


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

    def __init__(self, root: str | Path, budget_bytes: int | None) -> None:
        self.root = Path(root)
        self.budget = budget_bytes
        self.layout = ""
        self._entries: dict[str, DiskEntry] = {}   # by file name, oldest first
        self.skipped = 0

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
        return {"entries": len(self._entries), "bytes": self.nbytes}

    # -- lookup -------------------------------------------------------------------

    def best(self, ns: str, prompt: np.ndarray, limit: int) -> tuple[int, DiskEntry] | None:
        """The entry supplying the most of `prompt`, as (n, entry)."""
        from .prompt_cache import usable

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
        """Write one entry (unless the same bytes are already here)."""
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
        fd, tmp = tempfile.mkstemp(prefix=".write-", suffix=".safetensors", dir=self.root)
        os.close(fd)
        try:
            mx.save_safetensors(tmp, tensors, metadata=meta)
            digest = _sha256(Path(tmp))
            path = self.root / f"{digest}.safetensors"
            if path.name in self._entries:
                return
            os.replace(tmp, path)
        except OSError as e:
            log.warning("prompt cache disk: could not write an entry: %s", e)
            return
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        self._entries[path.name] = DiskEntry(path, ns, tokens, cuttable, path.stat().st_size)
        self._evict()

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

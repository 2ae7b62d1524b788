"""A process-wide prefix cache of prompt caches, shared by every slot.

Theory of operation: when a sequence leaves the generator (finished or
cancelled) its per-layer caches and the tokens they hold are *donated* here
under a namespace (the model identity plus "raw" or the chat template's
signature, so a raw prompt never adopts a chat-rendered prefix).  When a
job is admitted the scheduler *looks up* the longest usable stored prefix
of its prompt in its namespace and hands a copy of it to mlx-lm's
`BatchGenerator.insert(caches=...)`, which prefills only the rest.

Cache kinds (cache_kinds.py): an entry whose layers can all be cut (plain
or stored KV, a sliding window not yet full) serves any prefix of its
tokens.  One holding a full sliding window or a recurrent state serves only
its whole token run: it is a *snapshot*, which the scheduler takes at reuse
points while a prompt is prefilled (the end of each chat message, every
SNAPSHOT_EVERY tokens, the end of the prompt) as well as at release.

The store keeps what no other entry covers: a donation that is a prefix of
a stored entry that can be cut to it is dropped, and stored entries that
are prefixes of a cuttable donation are replaced by it; snapshots of one
prompt at several points coexist.  Lookup compares the prompt with each
entry of its namespace (vectorized; the entry count is bounded by the byte
budget).  Eviction is LRU, by bytes (snapshots counted whole), against the
--cache-ram budget.

Beneath the memory tier an optional disk tier (cache_disk.py, --cache-disk)
keeps every stored entry as a file: a lookup that finds a longer prefix on
disk than in memory loads that file (lazily, checksum verified) into memory
first.  `last_tier` says where the last lookup's prefix came from.

Aliasing: mlx-lm's caches write new tokens with slice assignment into
their arrays.  A stored entry therefore never hands out its own array
objects: adoption builds fresh cache objects over sliced arrays, so a write
into an adopted cache can never reach the store (and donated arrays come
from `extract`, which makes new ones).

Engine thread only; nothing here runs per decode step.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

from . import cache_kinds, kv_shift

log = logging.getLogger("mlxcel.engine.cache")

MIB = 1024 * 1024
# a long prompt of a model whose caches cannot be cut is snapshotted every
# this many tokens (besides each message end and the prompt end): a later
# prompt that shares only part of it re-prefills fewer than this many
SNAPSHOT_EVERY = 512
TIERS = ("memory", "disk", "none")


def supported(layers: Sequence[Any]) -> bool:
    """Whether every layer is a kind the cache can store (cache_kinds.py)."""
    return cache_kinds.supported(list(layers))


def needs_snapshots(layers: Sequence[Any]) -> bool:
    """Whether some layer kind cannot be cut to any prefix once it has
    filled (a sliding window) or at all (a recurrent state)."""
    return any(cache_kinds.kind_of(c).name in ("rotating", "arrays") for c in layers)


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    m = min(len(a), len(b))
    if m == 0:
        return 0
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if diff.size else m


def usable(tokens: np.ndarray, cuttable: bool, prompt: np.ndarray, limit: int) -> int:
    """How many of `prompt`'s first tokens an entry holding `tokens` can
    supply, leaving at least one of the `limit + 1` to evaluate."""
    k = min(_common_prefix(tokens, prompt), limit)
    if cuttable or k == len(tokens):
        return k
    return 0


class _Entry:
    __slots__ = ("ns", "tokens", "layers", "nbytes", "cuttable")

    def __init__(self, ns: str, tokens: np.ndarray, layers: list, nbytes: int,
                 cuttable: bool) -> None:
        self.ns = ns
        self.tokens = tokens
        self.layers = layers
        self.nbytes = nbytes
        self.cuttable = cuttable


class PromptCache:
    """Entries of a token trie per namespace, LRU-evicted against a byte
    budget, over an optional disk tier.

    `budget_bytes` None means no limit (upstream's --cache-ram -1).
    """

    def __init__(self, budget_bytes: int | None, disk=None) -> None:
        self.budget = budget_bytes
        self.disk = disk                 # cache_disk.DiskTier or None
        self._lru: OrderedDict[int, _Entry] = OrderedDict()   # oldest first
        self._ids = 0
        self.nbytes = 0
        self.peak_nbytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0   # entries dropped for the budget (/metrics)
        self.disk_hits = 0
        self.reused = {"memory": 0, "disk": 0}   # prompt tokens supplied, by tier
        self.shifted = 0     # of those, tokens in chunks moved to a new position
        self.last_tier = "none"

    def __len__(self) -> int:
        return len(self._lru)

    def bind(self, layers: list) -> None:
        """Open the disk tier for a model whose fresh caches are `layers`."""
        if self.disk is not None:
            self.disk.open(cache_kinds.layout_of(layers))

    def clear(self) -> None:
        """Drop every memory entry (the arrays go when the last adopter lets
        go); the disk tier keeps its files."""
        self._lru.clear()
        self.nbytes = 0

    # -- lookup --------------------------------------------------------------------

    def lookup(self, ns: str, prompt: Sequence[int], min_chunk: int = 0,
               shifter: kv_shift.Shifter | None = None) -> tuple[int, list | None]:
        """The longest usable stored prefix of `prompt` in `ns`, as (n, fresh
        per-layer caches holding its first n tokens).  At least one prompt
        token is always left to evaluate, so n <= len(prompt) - 1.

        With `min_chunk` > 0 and a `shifter` (kv_shift.py, --cache-reuse),
        runs of at least `min_chunk` cached tokens after the prefix are
        reused too, their keys re-rotated to the prompt's positions; the
        entry supplying the most prompt tokens wins."""
        limit = len(prompt) - 1
        best, best_n, tier = None, 0, "memory"
        p = np.asarray(prompt, dtype=np.int64)
        if limit > 0:
            for key, e in self._lru.items():
                if e.ns != ns:
                    continue
                n = usable(e.tokens, e.cuttable, p, limit)
                if n >= best_n and n > 0:   # ties go to the most recently used
                    best, best_n = key, n
            while self.disk is not None:
                found = self.disk.best(ns, p, limit)
                if found is None or found[0] <= best_n:
                    break
                key = self._from_disk(found[1])   # None: skipped, the next best is tried
                if key is not None:
                    best, best_n, tier = key, found[0], "disk"
                    break
        segments = None
        if min_chunk > 0 and shifter is not None and limit > 0:
            for key, e in self._lru.items():
                if e.ns != ns or not e.cuttable:
                    continue
                n_past = min(_common_prefix(e.tokens, p), limit)
                n, runs = kv_shift.plan(e.tokens, p, n_past, min_chunk, limit)
                if n > best_n and len(runs) > (1 if n_past else 0):
                    best, best_n, tier, segments = key, n, "memory", runs
        if best is None:
            self.misses += 1
            self.last_tier = "none"
            return 0, None
        entry = self._lru[best]
        self._lru.move_to_end(best)
        self.hits += 1
        self.last_tier = tier
        self.reused[self.last_tier] += best_n
        if segments is not None:
            moved = sum(n for src, dst, n in segments if src != dst)
            self.shifted += moved
            log.debug("prompt cache hit (memory): %d of %d prompt tokens, %d of them in %d "
                      "shifted chunk(s)", best_n, len(prompt), moved,
                      sum(src != dst for src, dst, _ in segments))
            return best_n, shifter.build(entry.layers, segments)
        log.debug("prompt cache hit (%s): %d of %d prompt tokens", self.last_tier, best_n,
                  len(prompt))
        return best_n, cache_kinds.cut(entry.layers, best_n)

    def _from_disk(self, item) -> int | None:
        """Load a disk entry into memory (it stays on disk); its key, or None
        when the file no longer reads back as written."""
        layers = self.disk.load(item)
        if layers is None:
            return None
        self.disk_hits += 1
        return self._store(item.ns, item.tokens, layers, write=False)

    # -- donation ------------------------------------------------------------------

    def donate(self, ns: str, tokens: Sequence[int], layers: list) -> bool:
        """Store `layers` (the caches of exactly `tokens`) unless a stored
        entry already covers it; returns whether it was stored."""
        n = len(tokens)
        if n == 0 or not layers or any(k != n for k in cache_kinds.lengths(layers)):
            return False
        if self.budget is not None and sum(c.nbytes for c in layers) > self.budget:
            return False
        return self._store(ns, np.asarray(tokens, dtype=np.int64), layers) is not None

    def _store(self, ns: str, t: np.ndarray, layers: list, write: bool = True) -> int | None:
        import mlx.core as mx

        n = len(t)
        cuttable = cache_kinds.cuttable(layers)
        drop = []
        for key, e in self._lru.items():
            if e.ns != ns:
                continue
            k = _common_prefix(e.tokens, t)
            if k == n and (e.cuttable or len(e.tokens) == n):
                self._lru.move_to_end(key)   # already covered by a longer (or equal) one
                return key if not write else None
            if k == len(e.tokens) and cuttable:   # the stored one is a prefix of this one
                drop.append(key)
        for key in drop:
            self._remove(key)
        # Materialize now: a lazy slice would keep the whole batch buffer alive.
        mx.eval(cache_kinds.arrays_of(layers))
        nbytes = sum(c.nbytes for c in layers)
        self._ids += 1
        self._lru[self._ids] = _Entry(ns, t, layers, nbytes, cuttable)
        self.nbytes += nbytes
        if write and self.disk is not None:
            self.disk.put(ns, t, layers, cuttable)
        self._evict()
        self.peak_nbytes = max(self.peak_nbytes, self.nbytes)
        return self._ids if self._ids in self._lru else None

    def _remove(self, key: int) -> None:
        e = self._lru.pop(key)
        self.nbytes -= e.nbytes

    def _evict(self) -> None:
        if self.budget is None:
            return
        while self.nbytes > self.budget and self._lru:
            key = next(iter(self._lru))
            log.debug("prompt cache: evicting %d tokens (%d bytes) over the %d-byte budget",
                      len(self._lru[key].tokens), self._lru[key].nbytes, self.budget)
            self._remove(key)
            self.evictions += 1

    def stats(self) -> dict[str, int]:
        disk = (self.disk.stats() if self.disk is not None
                else {"entries": 0, "bytes": 0, "write_dropped": 0})
        return {"entries": len(self._lru), "bytes": self.nbytes,
                "peak_bytes": self.peak_nbytes,
                "budget_bytes": -1 if self.budget is None else self.budget,
                "hits": self.hits, "misses": self.misses, "evictions": self.evictions,
                "disk_hits": self.disk_hits,
                "reused_memory": self.reused["memory"], "reused_disk": self.reused["disk"],
                "reused_shifted": self.shifted,
                "disk_entries": disk["entries"], "disk_bytes": disk["bytes"],
                "disk_write_dropped": disk["write_dropped"]}


def adopt(layers: list, n: int) -> list:
    """Fresh cache objects over the first n positions of `layers`: new
    array objects (slices), so writes into them never reach the source."""
    return cache_kinds.cut(layers, n)


def budget_from_mib(mib: int) -> int | None:
    """--cache-ram: -1 = no limit, 0 = disabled (the caller keeps no cache)."""
    return None if mib < 0 else mib * MIB

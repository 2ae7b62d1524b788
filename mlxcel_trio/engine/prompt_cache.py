"""A process-wide prefix cache of prompt KV, shared by every slot.

Theory of operation: when a sequence leaves the generator (finished or
cancelled) its per-layer KV and the tokens it holds are *donated* here under a
namespace (the model identity plus "raw" or the chat template's signature, so
a raw prompt never adopts a chat-rendered prefix).  When a job is admitted the
scheduler *looks up* the longest stored prefix of its prompt in its
namespace and hands a trimmed copy of that KV to mlx-lm's
`BatchGenerator.insert(caches=...)`, which prefills only the rest.

The store keeps only the leaves of the token trie: a donation that is a
prefix of a stored entry is dropped (the entry already covers it, since
trimming a KV cache is free), and stored entries that are prefixes of a
donation are replaced by it.  Lookup therefore compares the prompt with each
leaf of its namespace (vectorized; the leaf count is bounded by the byte
budget), which finds what a walk down the trie would.  Eviction is LRU over
leaves, by bytes, against the --cache-ram budget.

Aliasing: mlx-lm's KVCache writes new tokens with slice assignment into its
`keys` / `values` arrays.  A stored entry therefore never hands out its own
array objects: adoption builds fresh cache objects over *sliced* arrays,
so a write into an adopted cache can never reach the store (and donated
arrays come from `extract`, which makes new ones).

Engine thread only; nothing here runs per decode step.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

log = logging.getLogger("mlxcel.engine.cache")

MIB = 1024 * 1024


def supported(layers: Sequence[Any]) -> bool:
    """Only full-attention KV caches (plain, or stored in a -ctk / -ctv
    format) can be stored and cut to a prefix; rotating and recurrent
    caches are not cached."""
    from mlx_lm.models.cache import KVCache

    from .kv_cache import is_stored

    return bool(layers) and all(type(c) is KVCache or is_stored(c) for c in layers)


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    m = min(len(a), len(b))
    if m == 0:
        return 0
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if diff.size else m


class _Entry:
    __slots__ = ("ns", "tokens", "layers", "nbytes")

    def __init__(self, ns: str, tokens: np.ndarray, layers: list, nbytes: int) -> None:
        self.ns = ns
        self.tokens = tokens
        self.layers = layers
        self.nbytes = nbytes


class PromptCache:
    """Leaves of a token trie per namespace, LRU-evicted against a byte budget.

    `budget_bytes` None means no limit (upstream's --cache-ram -1).
    """

    def __init__(self, budget_bytes: int | None) -> None:
        self.budget = budget_bytes
        self._lru: OrderedDict[int, _Entry] = OrderedDict()   # oldest first
        self._ids = 0
        self.nbytes = 0
        self.peak_nbytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0   # entries dropped for the budget (/metrics)

    def __len__(self) -> int:
        return len(self._lru)

    def clear(self) -> None:
        """Drop every entry (the arrays go when the last adopter lets go)."""
        self._lru.clear()
        self.nbytes = 0

    # -- lookup --------------------------------------------------------------------

    def lookup(self, ns: str, prompt: Sequence[int]) -> tuple[int, list | None]:
        """The longest stored prefix of `prompt` in `ns`, as (n, fresh
        per-layer caches holding its first n tokens).  At least one prompt
        token is always left to evaluate, so n <= len(prompt) - 1."""
        limit = len(prompt) - 1
        best, best_n = None, 0
        if limit > 0 and self._lru:
            p = np.asarray(prompt, dtype=np.int64)
            for key, e in self._lru.items():
                if e.ns != ns:
                    continue
                n = _common_prefix(e.tokens, p)
                if n >= best_n and n > 0:   # ties go to the most recently used
                    best, best_n = key, n
        if best is None:
            self.misses += 1
            return 0, None
        n = min(best_n, limit)
        entry = self._lru[best]
        self._lru.move_to_end(best)
        self.hits += 1
        log.debug("prompt cache hit: %d of %d prompt tokens", n, len(prompt))
        return n, adopt(entry.layers, n)

    # -- donation ------------------------------------------------------------------

    def donate(self, ns: str, tokens: Sequence[int], layers: list) -> bool:
        """Store `layers` (KV for exactly `tokens`) unless a stored entry
        already covers it; returns whether it was stored."""
        import mlx.core as mx

        n = len(tokens)
        if n == 0 or not layers or any(c.offset != n for c in layers):
            return False
        t = np.asarray(tokens, dtype=np.int64)
        drop = []
        for key, e in self._lru.items():
            if e.ns != ns:
                continue
            k = _common_prefix(e.tokens, t)
            if k == n:               # already covered by a longer (or equal) leaf
                self._lru.move_to_end(key)
                return False
            if k == len(e.tokens):   # the stored leaf is a prefix of this one
                drop.append(key)
        nbytes = sum(c.nbytes for c in layers)
        if self.budget is not None and nbytes > self.budget:
            return False
        for key in drop:
            self._remove(key)
        # Materialize now: a lazy slice would keep the whole batch buffer alive.
        mx.eval([a for c in layers for a in (c.keys, c.values)])
        self._ids += 1
        self._lru[self._ids] = _Entry(ns, t, layers, nbytes)
        self.nbytes += nbytes
        self._evict()
        self.peak_nbytes = max(self.peak_nbytes, self.nbytes)
        return True

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
        return {"entries": len(self._lru), "bytes": self.nbytes,
                "peak_bytes": self.peak_nbytes,
                "budget_bytes": -1 if self.budget is None else self.budget,
                "hits": self.hits, "misses": self.misses, "evictions": self.evictions}


def adopt(layers: list, n: int) -> list:
    """Fresh cache objects over the first n positions of `layers`: new
    array objects (slices), so writes into them never reach the source."""
    from .kv_cache import is_stored, plain_prefix

    return [c.prefix(n) if is_stored(c) else plain_prefix(c, n) for c in layers]


def budget_from_mib(mib: int) -> int | None:
    """--cache-ram: -1 = no limit, 0 = disabled (the caller keeps no cache)."""
    return None if mib < 0 else mib * MIB

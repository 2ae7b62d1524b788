"""ngram-map-k, ngram-map-k4v and ngram-mod: n-gram drafters with memory.

ngram-map-k / ngram-map-k4v (upstream's common_ngram_map): the key is the
last `size_n` tokens (the sampled one included); a match is its latest
earlier occurrence that still has `size_m` tokens after it.  Per key the
drafter remembers how many times it was looked up and, per proposed
continuation, how many tokens the last verify step accepted, and never
proposes more than that again.  -k proposes what followed the match;
-k4v also counts up to four distinct m-grams that followed the key and
proposes only when the key was seen `min_hits` times and its most frequent
continuation is at least twice as frequent as all the others together.

ngram-mod (upstream's common_ngram_mod): one table shared by every row,
mapping each `n_match`-gram seen in any row's history to the token that
followed it; a proposal chains lookups, must reach `n_min` tokens and stops
at `n_max`.  The table is emptied when it grows past a quarter of upstream's
4M entries, and by a row that saw five verify steps in a row accept less
than a quarter of its proposal.

Each keeps per-row state keyed by the generator's uid (a row's history only
grows while it has one; a context shift re-inserts it under a new uid).
Engine thread only.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .drafters import Ask, PerRow

MAX_VALUES = 4                 # m-grams remembered per key (k4v)
MAX_COUNT = 16380              # upstream's cap on a counter
MOD_ENTRIES = 4 * 1024 * 1024  # upstream's table size; emptied past a quarter of it


@attrs.define(slots=True)
class _Value:
    idx: int = 0               # where the m-gram starts in the history (0 = unused)
    num: int = 0               # times it followed the key
    n_accepted: int = 0        # tokens the last verify kept of a draft from it


@attrs.define(slots=True)
class _Key:
    hits: int = 0
    stat_idx: int = 0          # the value counts cover occurrences up to here
    values: list[_Value] = attrs.Factory(list)


class _MapRow:
    __slots__ = ("at", "keys", "last", "prefixes", "upto")

    def __init__(self) -> None:
        self.upto = 0                                  # positions indexed so far
        self.at: dict[tuple, list[int]] = {}           # key n-gram -> its positions
        self.prefixes: set[tuple] = set()              # their first n - 1 tokens
        self.keys: dict[tuple, _Key] = {}
        self.last: tuple[tuple, int] | None = None     # (key, value) of the last draft


class NgramMap(PerRow):
    def __init__(self, size_n: int, size_m: int, min_hits: int, key_only: bool) -> None:
        self.n, self.m, self.min_hits, self.key_only = size_n, size_m, min_hits, key_only
        self._rows: dict[int, _MapRow] = {}

    def _index(self, uid: int, h: list[int]) -> _MapRow:
        """Index every key position that has size_m tokens after it."""
        r = self._rows.get(uid)
        if r is None:
            r = self._rows[uid] = _MapRow()
        n, end = self.n, len(h) - self.n - self.m - 1
        for j in range(max(r.upto, 1), end):
            key = tuple(h[j:j + n])
            r.at.setdefault(key, []).append(j)
            r.prefixes.add(key[:-1])
        r.upto = max(r.upto, end)
        return r

    def may_propose(self, uid: int, history: list[int]) -> bool:
        if len(history) < 2 * self.n + self.m:
            return False
        r = self._index(uid, history)
        return tuple(history[len(history) - self.n + 1:]) in r.prefixes

    def propose(self, asks: Sequence[Ask]) -> list[list[int]]:
        return [self._one(a.uid, a.history, a.last) for a in asks]

    def _one(self, uid: int, h: list[int], last: int) -> list[int]:
        n, m = self.n, self.m
        if len(h) < 2 * n + m:
            return []
        r = self._index(uid, h)
        r.last = None
        key = (*h[len(h) - n + 1:], last)
        where = r.at.get(key)
        if not where:
            return []
        match = where[-1]
        stats = r.keys.get(key)
        if stats is None:
            stats = r.keys[key] = _Key(values=[_Value(n_accepted=m) for _ in range(MAX_VALUES)])
        stats.hits = min(stats.hits + 1, MAX_COUNT)
        pick = 0
        if not self.key_only:
            if stats.hits < self.min_hits:
                return []
            self._count_values(h, stats, where, match)
            nums = [v.num for v in stats.values]
            pick = max(range(MAX_VALUES), key=lambda v: (nums[v], -v))
            others = sum(nums) - nums[pick]
            if others > 0 and nums[pick] < 2 * others:
                return []   # no continuation clearly dominates
        take = min(m, stats.values[pick].n_accepted)
        r.last = (key, pick)
        return h[match + n:match + n + take]

    def _count_values(self, h: list[int], stats: _Key, where: list[int], match: int) -> None:
        """Count the m-grams that followed the key at its occurrences from
        stat_idx up to the match (inclusive, as upstream's loop is)."""
        n, m = self.n, self.m
        for i in where:
            if i < stats.stat_idx or i > match:
                continue
            start = i + n
            for v in stats.values:
                if v.idx == 0:
                    v.idx, v.num, v.n_accepted = start, 0, m
                elif h[start:start + m] != h[v.idx:v.idx + m]:
                    continue
                v.num = min(v.num + 1, MAX_COUNT)
                break
        stats.stat_idx = match

    def accepted(self, uid: int, n_drafted: int, n_accepted: int) -> None:
        r = self._rows.get(uid)
        if r is not None and r.last is not None:
            key, value = r.last
            r.keys[key].values[value].n_accepted = n_accepted


class _ModRow:
    __slots__ = ("i_last", "n_last", "n_low")

    def __init__(self) -> None:
        self.i_last = 0      # history positions up to here are in the table
        self.n_last = 0      # length of the last proposal
        self.n_low = 0       # verify steps in a row that kept under a quarter


class NgramMod:
    def __init__(self, n_match: int, n_min: int, n_max: int) -> None:
        self.n, self.n_min, self.n_max = n_match, n_min, n_max
        self._next: dict[tuple, int] = {}      # n-gram -> the token that followed it
        self._prefixes: set[tuple] = set()     # their first n - 1 tokens
        self._rows: dict[int, _ModRow] = {}

    def _reset(self) -> None:
        self._next.clear()
        self._prefixes.clear()

    def _add(self, h: list[int], start: int, stop: int) -> None:
        n = self.n
        for i in range(start, stop):
            gram = tuple(h[i:i + n])
            self._next[gram] = h[i + n]
            self._prefixes.add(gram[:-1])

    def _row(self, uid: int, h: list[int]) -> _ModRow:
        """A new row adds its whole prompt (upstream's begin); later rows
        add their new n-grams in chunks of 32 tokens."""
        r = self._rows.get(uid)
        n, size = self.n, len(h)
        if r is None:
            r = self._rows[uid] = _ModRow()
            if size >= n:
                self._add(h, 0, size - n)
                r.i_last = size - n
                if len(self._next) > MOD_ENTRIES // 4:
                    self._reset()
        elif size >= n and r.i_last + 32 < size:
            self._add(h, r.i_last, size - n)
            r.i_last = size - n
        return r

    def may_propose(self, uid: int, history: list[int]) -> bool:
        self._row(uid, history)
        return (len(history) >= self.n
                and tuple(history[len(history) - self.n + 1:]) in self._prefixes)

    def propose(self, asks: Sequence[Ask]) -> list[list[int]]:
        return [self._one(a.uid, a.history, a.last) for a in asks]

    def _one(self, uid: int, h: list[int], last: int) -> list[int]:
        r = self._row(uid, h)
        r.n_last = 0
        n = self.n
        if len(h) < n:
            return []
        window = [*h[len(h) - n + 1:], last]
        draft: list[int] = []
        for i in range(self.n_max):
            tok = self._next.get(tuple(window[len(window) - n:]))
            if tok is None:
                if i < self.n_min:
                    return []
                break
            draft.append(tok)
            window.append(tok)
        r.n_last = len(draft)
        return draft

    def accepted(self, uid: int, n_drafted: int, n_accepted: int) -> None:
        r = self._rows.get(uid)
        if r is None or r.n_last <= 0:
            return
        if n_accepted / r.n_last < 0.25:
            r.n_low += 1
            if r.n_low >= 5:
                self._reset()
                r.n_low, r.i_last = 0, 0
        else:
            r.n_low = 0

    def forget(self, uid: int) -> None:
        self._rows.pop(uid, None)

    def clear(self) -> None:
        self._rows.clear()
        self._reset()

"""Drafters: who proposes the tokens a verify step checks.

A drafter answers one `Ask` per speculating row with a list of proposed
tokens (possibly empty).  `Chain` tries the configured drafters in
--spec-type order and takes the first non-empty proposal, as upstream
does.  The n-gram drafters read only the row's token history; the draft
model (draft_model.py) runs a second, small model.

Engine thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import attrs


@attrs.define(slots=True)
class Ask:
    """One row's request for a draft."""

    uid: int
    history: list[int]      # the tokens the target's KV holds (not copied; read only)
    last: int               # the sampled token the next forward will feed
    n_max: int              # the most tokens the row can use this step (room, n_predict)
    n_min: int = 0          # a draft-model proposal shorter than this is dropped
    p_min: float = 0.0      # a draft model stops below this top probability
    banned: tuple[int, ...] = ()  # tokens the row never samples (ignore_eos)
    draft_n_max: int = 1 << 30  # the draft model's own cap (--spec-draft-n-max);
                                # the n-gram types are capped by their sizes instead


class Drafter(Protocol):
    def may_propose(self, uid: int, history: list[int]) -> bool:
        """Whether a proposal is possible at all, known before the pending
        token is read (reading it stalls the pipelined decode step)."""
        ...

    def propose(self, asks: Sequence[Ask]) -> list[list[int]]: ...

    def accepted(self, uid: int, n_drafted: int, n_accepted: int) -> None: ...

    def forget(self, uid: int) -> None: ...

    def clear(self) -> None: ...


class PerRow:
    """A drafter whose state is one entry per generator row (`_rows`, keyed
    by uid): forgotten with the row, emptied with the generator."""

    _rows: dict

    def accepted(self, uid: int, n_drafted: int, n_accepted: int) -> None:
        pass

    def forget(self, uid: int) -> None:
        self._rows.pop(uid, None)

    def clear(self) -> None:
        self._rows.clear()


class NgramSimple(PerRow):
    """ngram-simple: find the latest earlier occurrence of the last `size_n`
    tokens (the sampled one included) and propose the `size_m` tokens that
    followed it.  Needs more than size_n + size_m + 1 tokens of history; a
    match whose continuation is shorter than size_n proposes nothing.

    Each row indexes its history's (size_n - 1)-grams as it grows, so a step
    costs the new tokens, not the whole history."""

    def __init__(self, size_n: int, size_m: int) -> None:
        self.n, self.m = size_n, size_m
        self._rows: dict[int, tuple[list[int], dict[tuple, list[int]]]] = {}

    def _index(self, uid: int, h: list[int]) -> dict[tuple, list[int]]:
        row = self._rows.get(uid)
        if row is None:
            row = self._rows[uid] = ([1], {})
        upto, index = row
        k, last_j = self.n - 1, len(h) - self.n - 1
        for j in range(upto[0], last_j + 1):
            index.setdefault(tuple(h[j:j + k]), []).append(j)
        upto[0] = max(upto[0], last_j + 1)
        return index

    def may_propose(self, uid: int, history: list[int]) -> bool:
        size = len(history)
        if size <= self.n + self.m + 1:
            return False
        index = self._index(uid, history)
        return tuple(history[size - self.n + 1:]) in index

    def propose(self, asks: Sequence[Ask]) -> list[list[int]]:
        return [self._one(a.uid, a.history, a.last) for a in asks]

    def _one(self, uid: int, h: list[int], last: int) -> list[int]:
        n, m, size = self.n, self.m, len(h)
        if size <= n + m + 1:
            return []
        found = self._index(uid, h).get(tuple(h[size - n + 1:]), ())
        for j in reversed(found):
            if h[j + n - 1] == last:
                take = min(m, size - (j + n))
                return h[j + n:j + n + take] if take >= n else []
        return []


class Chain:
    """The configured drafters in trial order."""

    def __init__(self, drafters: Sequence[Drafter]) -> None:
        self.drafters = list(drafters)
        self._last: dict[int, Drafter] = {}   # uid -> the drafter that proposed

    def may_propose(self, uid: int, history: list[int]) -> bool:
        # every drafter is asked: each keeps what it found for propose
        return any([d.may_propose(uid, history) for d in self.drafters])  # noqa: C419

    def propose(self, asks: Sequence[Ask]) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in asks]
        todo = list(range(len(asks)))
        for drafter in self.drafters:
            if not todo:
                break
            got = drafter.propose([asks[i] for i in todo])
            left = []
            for i, d in zip(todo, got):
                if d:
                    out[i] = d[:asks[i].n_max]
                    self._last[asks[i].uid] = drafter
                else:
                    left.append(i)
            todo = left
        return out

    def accepted(self, uid: int, n_drafted: int, n_accepted: int) -> None:
        drafter = self._last.get(uid)
        if drafter is not None:
            drafter.accepted(uid, n_drafted, n_accepted)

    def forget(self, uid: int) -> None:
        self._last.pop(uid, None)
        for d in self.drafters:
            d.forget(uid)

    def clear(self) -> None:
        """A fresh generator numbers its rows from 0 again."""
        self._last.clear()
        for d in self.drafters:
            d.clear()

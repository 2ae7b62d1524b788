"""draft-simple: a small model with the target's vocabulary proposes the
next tokens greedily, batched over the rows that ask.

The asking rows share one batch cache per draft layer (mlx-lm's left-padded
BatchKVCache), kept from step to step, and each row remembers the tokens its
part of that cache holds.  Before drafting, every row's part is cut back to
its history minus the last token (a verify step may have rejected drafts,
or accepted the one draft never fed), and [last history token, pending
token] is fed for every row at once, so the batch stays aligned without
being told what was accepted; rows cut back by different counts use the
per-row rollback (rollback.py).  k greedy steps then run as one lazy graph,
evaluated once.  When the asking rows change (a row arrives, leaves or
skips a step, or a row's history moved by more than one token, as after a
context shift), the batch is rebuilt: each row's cache is taken out, caught
up with its history on its own, and the rows are merged again.

Upstream's draft-simple semantics: a proposal stops before the first token
whose draft probability is below p_min, and a proposal shorter than n_min
is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

from .drafters import Ask
from .rollback import rewind

PREFILL_CHUNK = 512


class _Row:
    __slots__ = ("cache", "held", "sure")

    def __init__(self) -> None:
        self.cache: list | None = None  # its own caches while outside the batch
        self.held: list[int] = []       # the tokens its cache (or batch row) holds
        self.sure = 0                   # held[:sure] is known to equal the history

    def shared(self, h: list[int]) -> int:
        """How many leading tokens `held` shares with the history `h`."""
        held, keep = self.held, self.sure
        limit = min(len(held), len(h))
        while keep < limit and held[keep] == h[keep]:
            keep += 1
        return keep


def cache_kinds(model) -> set[str]:
    return {type(c).__name__ for c in make_prompt_cache(model)}


class DraftModel:
    def __init__(self, model) -> None:
        self.model = model
        self._rows: dict[int, _Row] = {}
        self._batch: list | None = None   # one BatchKVCache per layer, rows in _order
        self._order: list[int] = []

    def forget(self, uid: int) -> None:
        self._rows.pop(uid, None)   # its batch row goes at the next rebuild

    def clear(self) -> None:
        self._rows.clear()
        self._batch, self._order = None, []

    def accepted(self, uid: int, n_drafted: int, n_accepted: int) -> None:
        pass  # the next propose re-syncs from the history

    def may_propose(self, uid: int, history: list[int]) -> bool:
        return True

    def propose(self, asks: Sequence[Ask]) -> list[list[int]]:
        if not asks:
            return []
        caps = [min(a.n_max, a.draft_n_max) for a in asks]
        k = max(caps)
        if k <= 0:
            return [[] for _ in asks]
        cache = self._aligned(asks)
        x = mx.array([[a.history[-1], a.last] for a in asks])
        toks, probs = [], []
        ban = None
        want_p = any(a.p_min > 0.0 for a in asks)
        for _ in range(k):
            logits = self.model(x, cache=cache)[:, -1, :].astype(mx.float32)
            if ban is None and any(a.banned for a in asks):
                ban = _ban_mask(asks, logits.shape[-1])
            if ban is not None:
                # propose what the row can draw: a banned token would be rejected
                logits = logits + ban
            tok = mx.argmax(logits, axis=-1)
            toks.append(tok)
            if want_p:  # the draw's probability, only when p_min can stop a draft
                p = mx.softmax(logits, axis=-1)
                probs.append(mx.take_along_axis(p, tok[:, None], axis=-1)[:, 0])
            else:
                probs.append(mx.ones(tok.shape, dtype=mx.float32))
            x = tok[:, None]
        toks_a, probs_a = mx.stack(toks, axis=1), mx.stack(probs, axis=1)
        mx.eval(toks_a, probs_a)
        toks_l, probs_l = toks_a.tolist(), probs_a.tolist()
        out = []
        for i, (a, cap) in enumerate(zip(asks, caps)):
            r = self._rows[a.uid]
            r.held.extend((a.history[-1], a.last))
            r.held.extend(toks_l[i][:k - 1])   # the last draft was never fed
            r.sure = len(a.history)
            draft = []
            for t, p in zip(toks_l[i][:cap], probs_l[i]):
                if p < a.p_min:
                    break
                draft.append(t)
            out.append(draft if len(draft) >= a.n_min else [])
        return out

    def _aligned(self, asks: Sequence[Ask]) -> list:
        """The batch cache with row i holding exactly asks[i].history[:-1]."""
        uids = [a.uid for a in asks]
        if self._batch is not None and uids == self._order:
            cuts = []
            for a in asks:
                r = self._rows[a.uid]
                if len(a.history) - r.shared(a.history) > 1:
                    break
                cuts.append(len(r.held) - (len(a.history) - 1))
            else:
                rewind(self._batch, cuts)
                for a in asks:
                    del self._rows[a.uid].held[len(a.history) - 1:]
                return self._batch
        self._take_out()
        caches = [self._catch_up(a) for a in asks]
        self._batch = [BatchKVCache.merge([c[i] for c in caches])
                       for i in range(len(caches[0]))]
        self._order = uids
        return self._batch

    def _take_out(self) -> None:
        """Give each batch row still known its own caches back."""
        if self._batch is not None:
            for i, uid in enumerate(self._order):
                r = self._rows.get(uid)
                if r is not None:
                    r.cache = [layer.extract(i) for layer in self._batch]
        self._batch, self._order = None, []

    def _catch_up(self, a: Ask) -> list:
        """One row's own caches, cut to what they share with the history
        and fed the rest of it but its last token."""
        r = self._rows.get(a.uid)
        if r is None:
            r = self._rows[a.uid] = _Row()
        if r.cache is None:
            r.cache, r.held, r.sure = make_prompt_cache(self.model), [], 0
        h = a.history
        keep = min(r.shared(h), len(h) - 1)
        if keep < len(r.held):
            for layer in r.cache:
                layer.trim(len(r.held) - keep)
            del r.held[keep:]
        missing = h[keep:len(h) - 1]
        for s in range(0, len(missing), PREFILL_CHUNK):
            self.model(mx.array([missing[s:s + PREFILL_CHUNK]]), cache=r.cache)
            mx.eval([c.state for c in r.cache])
        r.held.extend(missing)
        r.sure = len(r.held)
        cache, r.cache = r.cache, None   # the batch holds it now
        return cache


def _ban_mask(asks: Sequence[Ask], n_vocab: int) -> mx.array:
    mask = np.zeros((len(asks), n_vocab), dtype=np.float32)
    for i, a in enumerate(asks):
        banned = [t for t in a.banned if t < n_vocab]
        mask[i, banned] = -np.inf
    return mx.array(mask)

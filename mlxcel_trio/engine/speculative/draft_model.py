"""draft-simple: a small model with the target's vocabulary proposes the
next tokens greedily, batched over the rows that ask.

Each row owns one cache per draft layer and the list of tokens that cache
holds.  Before drafting, the cache is cut back to the longest prefix it
shares with the row's history (a verify step may have rejected what it
drafted) and the rest of the history is fed, so the drafter never needs to
be told what was accepted.  Then every asking row drafts in one batch: the
rows' caches are merged (mlx-lm's left-padded BatchKVCache), k greedy steps
run as one lazy graph evaluated once, and each row's cache is taken back
out.  A single asking row skips the merge.

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

PREFILL_CHUNK = 512


class _Row:
    __slots__ = ("cache", "held", "sure")

    def __init__(self, cache: list) -> None:
        self.cache = cache
        self.held: list[int] = []   # the tokens `cache` holds
        self.sure = 0               # held[:sure] is known to equal the history


def cache_kinds(model) -> set[str]:
    return {type(c).__name__ for c in make_prompt_cache(model)}


class DraftModel:
    def __init__(self, model) -> None:
        self.model = model
        self._rows: dict[int, _Row] = {}

    def forget(self, uid: int) -> None:
        self._rows.pop(uid, None)

    def clear(self) -> None:
        self._rows.clear()

    def accepted(self, uid: int, n_drafted: int, n_accepted: int) -> None:
        pass  # the next propose re-syncs from the history

    def may_propose(self, uid: int, history: list[int]) -> bool:
        return True

    def propose(self, asks: Sequence[Ask]) -> list[list[int]]:
        if not asks:
            return []
        rows = [self._sync(a) for a in asks]
        caps = [min(a.n_max, a.draft_n_max) for a in asks]
        k = max(caps)
        if k <= 0:
            return [[] for _ in asks]
        merged = len(rows) > 1
        cache = ([BatchKVCache.merge([r.cache[i] for r in rows])
                  for i in range(len(rows[0].cache))] if merged else rows[0].cache)
        x = mx.array([[a.last] for a in asks])
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
        for i, (a, r, cap) in enumerate(zip(asks, rows, caps)):
            if merged:
                r.cache = [layer.extract(i) for layer in cache]
            r.held.append(a.last)
            r.held.extend(toks_l[i][:k - 1])   # the last draft was never fed
            draft = []
            for t, p in zip(toks_l[i][:cap], probs_l[i]):
                if p < a.p_min:
                    break
                draft.append(t)
            out.append(draft if len(draft) >= a.n_min else [])
        return out

    def _sync(self, a: Ask) -> _Row:
        """Cut the row's cache to what it shares with the history, then
        feed the rest of the history."""
        r = self._rows.get(a.uid)
        if r is None:
            r = self._rows[a.uid] = _Row(make_prompt_cache(self.model))
        h, held = a.history, r.held
        keep = r.sure
        limit = min(len(held), len(h))
        while keep < limit and held[keep] == h[keep]:
            keep += 1
        if keep < len(held):
            for layer in r.cache:
                layer.trim(len(held) - keep)
            del held[keep:]
        missing = h[keep:]
        for s in range(0, len(missing), PREFILL_CHUNK):
            self.model(mx.array([missing[s:s + PREFILL_CHUNK]]), cache=r.cache)
            mx.eval([c.state for c in r.cache])
        held.extend(missing)
        r.sure = len(held)
        return r


def _ban_mask(asks: Sequence[Ask], n_vocab: int) -> mx.array:
    mask = np.zeros((len(asks), n_vocab), dtype=np.float32)
    for i, a in enumerate(asks):
        banned = [t for t in a.banned if t < n_vocab]
        mask[i, banned] = -np.inf
    return mx.array(mask)

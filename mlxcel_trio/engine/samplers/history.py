"""The stages that act on the raw logits: logit bias, the repetition
penalties, and DRY.

They run as the sequence's logits processor, before mlx-lm normalizes the
row, because the repetition penalty depends on the sign of the raw logit
(upstream multiplies a negative logit and divides a positive one).  The
history they read is the sequence's whole context, prompt included, as
upstream's sampler accepts the prompt tokens before generating.

* logit bias: a dense [vocab] vector added to the row (a ban is -inf).
* penalties: counts over the last `repeat_last_n` tokens, built with a
  scatter on the lazy context, so they cost no synchronization.
* DRY ("don't repeat yourself"): needs the window as Python ints (one
  token's worth of synchronization per step, only when enabled).  Its
  sequence breakers are derived by scanning the vocabulary for tokens whose
  text carries a breaker (upstream's get_overlapping_token_sequences); the
  result is cached per breaker set.
"""

from __future__ import annotations

import math
from functools import lru_cache

import mlx.core as mx
import numpy as np

NEG_INF = -math.inf
DRY_MAX_BREAKER_BYTES = 40
DRY_MAX_TAIL_TOKENS = 20
_FLOAT_MAX_LOG = 88.7228391


def dense_bias(pairs, n_vocab: int) -> mx.array | None:
    """(token, bias) pairs -> a [vocab] vector; repeated tokens add up."""
    pairs = [(t, b) for t, b in pairs if 0 <= t < n_vocab]
    if not pairs:
        return None
    vec = np.zeros(n_vocab, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        np.add.at(vec, np.array([t for t, _ in pairs]), np.array([b for _, b in pairs],
                                                                  dtype=np.float32))
    return mx.array(vec)


def penalize(logits: mx.array, window: mx.array, n_vocab: int, repeat: float,
             frequency: float, presence: float) -> mx.array:
    """Upstream's penalties over the tokens in `window` (any order)."""
    counts = mx.zeros((n_vocab,), dtype=mx.float32).at[window].add(1.0)[None, :]
    seen = counts > 0
    scaled = mx.where(logits <= 0, logits * repeat, logits / repeat)
    return mx.where(seen, scaled - counts * frequency - presence, logits)


# -- DRY -----------------------------------------------------------------------------

class Breakers:
    """Processed sequence breakers: head token -> tails (token lists that
    follow the head to complete a breaker; empty = the head alone is one)."""

    def __init__(self, heads: dict[int, list[tuple[int, ...]]]) -> None:
        self.heads = heads
        self.single = frozenset(t for t, tails in heads.items() if () in tails)


def derive_breakers(breakers: tuple[str, ...], pieces, tokenize) -> Breakers:
    """`pieces[i]` is token i's bytes (specials rendered); `tokenize(text)`
    encodes without specials.  A token whose text contains a breaker is a
    single-token breaker; a token whose text ends with a breaker's prefix is
    a head, and the rest of the breaker, tokenized, its tail."""
    heads: dict[int, list[tuple[int, ...]]] = {}
    for text in breakers:
        brk = text.encode("utf-8")[:DRY_MAX_BREAKER_BYTES]
        if not brk:
            continue
        first = brk[:1]
        for tok, word in enumerate(pieces):
            if brk in word:
                tails = heads.setdefault(tok, [])
                if () not in tails:
                    tails.append(())
                continue
            pos = word.find(first)
            while pos != -1:
                n = min(len(brk), len(word) - pos)
                if word[pos:pos + n] == brk[:n]:
                    rest = brk[n:].decode("utf-8", errors="ignore")
                    tail = tuple(tokenize(rest)[:DRY_MAX_TAIL_TOKENS])
                    tails = heads.setdefault(tok, [])
                    if tail not in tails:
                        tails.append(tail)
                pos = word.find(first, pos + 1)
    return Breakers(heads)


def _z_values(s: list[int]) -> list[int]:
    """z[k] = length of the longest common prefix of s and s[k:]."""
    n = len(s)
    z = [0] * n
    lt = rt = 0
    for k in range(1, n):
        if k < rt:
            z[k] = min(rt - k, z[k - lt])
        while k + z[k] < n and s[z[k]] == s[k + z[k]]:
            z[k] += 1
        if k + z[k] > rt:
            lt, rt = k, k + z[k]
    return z


def dry_penalties(window: list[int], breakers: Breakers, multiplier: float, base: float,
                  allowed: int) -> dict[int, float]:
    """token -> penalty for the next position, given the last tokens
    (oldest first, already cut to dry_penalty_last_n)."""
    n = len(window)
    if n <= allowed:
        return {}
    rev = window[::-1]                    # rev[i]: the i-th most recent token
    limit = n
    for i, tok in enumerate(rev):
        tails = breakers.heads.get(tok)
        if not tails:
            continue
        longest = -1
        for tail in tails:
            m = len(tail)
            if longest < m <= i and all(tail[o] == rev[i - o - 1] for o in range(m)):
                longest = m
        if longest >= 0:
            limit = i - longest
            break
    if limit < allowed:
        return {}
    z = _z_values(rev)
    best: dict[int, int] = {}
    for k in range(1, n):
        length = min(z[k], limit)
        if length >= allowed:
            nxt = rev[k - 1]              # the token that followed that occurrence
            if best.get(nxt, -1) < length:
                best[nxt] = length
    max_exp = int(_FLOAT_MAX_LOG / math.log(base)) if base > 1.000001 else 0
    out: dict[int, float] = {}
    for tok, length in best.items():
        if tok in breakers.single:
            continue
        e = length - allowed
        if max_exp > 0 and e > max_exp:
            e = max_exp
        out[tok] = multiplier * base ** e
    return out


def apply_dry(logits: mx.array, penalties: dict[int, float]) -> mx.array:
    if not penalties:
        return logits
    ids = mx.array(list(penalties), dtype=mx.int32)
    vals = mx.array(list(penalties.values()), dtype=mx.float32)
    return logits.at[:, ids].add(-vals[None, :])


@lru_cache(maxsize=16)
def _cached(key, breakers: tuple[str, ...]) -> Breakers:
    vocab = key
    pieces = [vocab.piece(i) for i in range(vocab.n_vocab)]
    return derive_breakers(breakers, pieces, lambda s: vocab.tokenize(s, False, False))


def breakers_for(vocab, breakers: tuple[str, ...]) -> Breakers:
    return _cached(vocab, breakers)

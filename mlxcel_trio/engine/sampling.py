"""Per-sequence samplers for the batch generator.

A sampler maps one row of log-probabilities (shape [1, V]) to one token id
(shape [1]).  Greedy requests share the module-level `GREEDY` object so the
batch generator samples an all-greedy batch in one call; a stochastic request
owns its PRNG key, so its output depends only on its own seed, never on what
else is in the batch.

Filter order follows llama.cpp's default chain for the samplers served here:
top_k -> top_p -> min_p -> temperature -> draw.  top_p and min_p see the
distribution renormalized after the earlier filters, as upstream's softmax
between stages does.
"""

from __future__ import annotations

import random

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from .records import SamplingParams

RANDOM_SEED = 0xFFFF_FFFF


def _greedy(logprobs: mx.array) -> mx.array:
    return mx.argmax(logprobs, axis=-1)


GREEDY = _greedy


def _renormalize(x: mx.array) -> mx.array:
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


class ChainSampler:
    """top_k / top_p / min_p / temperature with a private PRNG stream."""

    def __init__(self, params: SamplingParams, n_vocab: int) -> None:
        seed = params.seed
        if seed == RANDOM_SEED:
            seed = random.getrandbits(32)
        self._key = mx.random.key(seed)
        self._top_k = params.top_k if 0 < params.top_k < n_vocab else 0
        self._top_p = params.top_p if params.top_p < 1.0 else 0.0
        self._min_p = params.min_p if params.min_p > 0.0 else 0.0
        self._inv_temp = 1.0 / params.temperature

    def __call__(self, logprobs: mx.array) -> mx.array:
        self._key, sub = mx.random.split(self._key)
        x = logprobs
        if self._top_k:
            x = _renormalize(apply_top_k(x, self._top_k))
        if self._top_p:
            x = _renormalize(apply_top_p(x, self._top_p))
        if self._min_p:
            x = apply_min_p(x, self._min_p)
        if self._inv_temp == 0.0:
            # an infinite temperature: uniform over what the filters kept
            # (0 * -inf would be NaN for the filtered-out tokens)
            x = mx.where(x > -mx.inf, 0.0, x)
        else:
            x = x * self._inv_temp
        return mx.random.categorical(x, key=sub)


def make_sampler(params: SamplingParams, n_vocab: int):
    """temperature <= 0 is greedy, as upstream."""
    if params.temperature <= 0.0:
        return GREEDY
    return ChainSampler(params, n_vocab)


def make_token_ban(token_ids, n_vocab: int):
    """A logits processor giving `token_ids` a -inf logit (upstream's
    ignore_eos: every end-of-generation token is banned, not just ignored)."""
    mask = mx.zeros((n_vocab,), dtype=mx.bool_)
    ids = [t for t in token_ids if 0 <= t < n_vocab]
    if ids:
        mask[mx.array(ids)] = True

    def ban(_context: mx.array, logits: mx.array) -> mx.array:
        return mx.where(mask, -mx.inf, logits)

    return ban

"""Per-sequence sampler state and the one sampler the batch shares.

Theory of operation.  mlx-lm's GenerationBatch runs, per step: the logits
processors of every row that has some (in row order), then either ONE call
of the sampler shared by every row on the whole [rows, vocab] block, or one
call per row on [1, vocab] when the rows' samplers differ.  Every row that
samples with the chain gets the same `BatchSampler` object and a `Row`
whose `process` is its logits processor; `process` applies the raw-logit
stages (bias, penalties, DRY), computes the grammar mask, and enqueues the
row.  The sampler then takes as many rows off the queue as it was given
and runs the chain on all of them at once.  So a batch that samples
entirely with the chain is sampled in one vectorized call, and a batch
mixing greedy rows (the shared GREEDY function, no processor or no enqueue)
with chain rows still pairs every call with the right rows, because both
sides run in row order.

Rules:
- Engine thread only.  A `Row` belongs to one sequence; the `BatchSampler`
  to one BatchGenerator (a fresh one after a failed step).
- Nothing here synchronizes with the device except DRY and the grammar
  matcher, which need the newest token as a Python int.
- State that evolves per step (mirostat's mu, adaptive-p's moving average)
  is updated lazily in the draw's graph and evaluated with it.
- The probability report for a token is queued when the token is drawn;
  mlx-lm delivers tokens one step later, in the same order, so the
  scheduler pops one report per delivered token.
"""

from __future__ import annotations

import random
from collections import deque

import mlx.core as mx
import numpy as np

from ...protocol.records import Constraint, SamplingParams
from . import chain, mirostat
from .history import apply_dry, dense_bias, dry_penalties, penalize

RANDOM_SEED = 0xFFFF_FFFF
NEG_INF = chain.NEG_INF


def resolve_seed(seed: int) -> int:
    return random.getrandbits(32) if seed == RANDOM_SEED else seed


def penalties_on(p: SamplingParams) -> bool:
    return p.mirostat == 0 and p.repeat_last_n > 0 and not (
        p.repeat_penalty == 1.0 and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0)


def dry_on(p: SamplingParams) -> bool:
    return (p.mirostat == 0 and p.dry_multiplier != 0.0 and p.dry_base >= 1.0
            and p.dry_penalty_last_n > 0)


class Row:
    """One sequence's sampling state (engine thread only)."""

    def __init__(self, params: SamplingParams, n_vocab: int, *, sampler: "BatchSampler | None",
                 breakers=None, constraint: Constraint | None = None) -> None:
        self.params = params
        self.n_vocab = n_vocab
        self.seed = resolve_seed(params.seed)
        self._rng = np.random.default_rng(self.seed)
        self._sampler = sampler              # None: greedy, nothing to enqueue
        self._bias = dense_bias(params.logit_bias, n_vocab)
        self._penalties = penalties_on(params)
        self._dry = dry_on(params)
        self._breakers = breakers
        self.constraint = constraint         # grammar state, or None
        self.history: list[int] = []         # context as ints (DRY / grammar only)
        self.mask: mx.array | None = None    # this step's grammar mask [1, vocab]
        self.raw: mx.array | None = None     # this step's raw logits (pre-sampling report)
        self.reports: deque = deque()
        self.mu = mx.array([[mirostat.initial_mu(params.mirostat_tau)]], dtype=mx.float32)
        decay = min(max(params.adaptive_decay, 0.0), 0.99)
        self.decay = decay
        self.ada_sum = mx.array([[params.adaptive_target / (1.0 - decay)]], dtype=mx.float32)
        self.ada_total = mx.array([[1.0 / (1.0 - decay)]], dtype=mx.float32)
        self.want_raw = params.n_probs > 0 and not params.post_sampling_probs

    @property
    def needs_processor(self) -> bool:
        return (self._sampler is not None or self._bias is not None or self._penalties
                or self._dry or self.constraint is not None)

    @property
    def draws(self) -> bool:
        """Whether this row draws random numbers (it samples with the chain)."""
        return self._sampler is not None

    def rng_state(self) -> dict:
        return self._rng.bit_generator.state

    def rng_restore(self, state: dict, n_draws: int) -> None:
        """Back to `state`, then forward by n_draws steps' uniforms: a
        verify step draws for every drafted position and keeps fewer."""
        self._rng.bit_generator.state = state
        self._rng.random(4 * n_draws)

    def uniforms(self) -> np.ndarray:
        """Four draws per step: XTC and dist, then the same pair again for a
        grammar resample."""
        return self._rng.random(4)

    def _sync_history(self, context: mx.array) -> None:
        seen = len(self.history)
        if context.shape[0] > seen:
            self.history.extend(context[seen:].tolist())

    def process(self, context: mx.array, logits: mx.array) -> mx.array:
        """The logits processor: raw-logit stages, grammar mask, enqueue."""
        p = self.params
        logits = chain.sanitize(logits)
        if self.want_raw:
            self.raw = logits
        if self._bias is not None:
            logits = logits + self._bias
        if self.constraint is not None:
            # start this step's forward pass now, so the device computes it
            # while the grammar mask is computed here on the CPU
            mx.async_eval(logits)
        if self._dry or self.constraint is not None:
            self._sync_history(context)
        if self._penalties:
            n = context.shape[0]
            window = context[max(0, n - p.repeat_last_n):n]
            logits = penalize(logits, window, self.n_vocab, p.repeat_penalty,
                              p.frequency_penalty, p.presence_penalty)
        if self._dry:
            window = self.history[-p.dry_penalty_last_n:]
            logits = apply_dry(logits, dry_penalties(window, self._breakers, p.dry_multiplier,
                                                     p.dry_base, p.dry_allowed_length))
        if self.constraint is not None:
            mask = self.constraint.mask_for(self.history)
            self.mask = None if mask is None else mx.array(mask)
        if self._sampler is not None:
            self._sampler.enqueue(self)
        return logits


def _top(x: mx.array, n: int) -> mx.array:
    """Positions of the n largest values of a [1, width] row, best first."""
    if n < x.shape[-1]:
        part = mx.argpartition(-x, kth=n - 1, axis=-1)[:, :n]
    else:
        part = mx.broadcast_to(mx.arange(x.shape[-1])[None, :], x.shape)
    order = mx.argsort(-mx.take_along_axis(x, part, axis=-1), axis=-1)
    return mx.take_along_axis(part, order, axis=-1)


def _stack(rows, attr):
    return mx.concatenate([getattr(r, attr) for r in rows], axis=0)


class BatchSampler:
    """The sampler every chain row shares (see the module docstring)."""

    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab
        self._queue: list[Row] = []
        self._chain_key: tuple = ()
        self._chain_params: chain.ChainParams | None = None

    def enqueue(self, row: Row) -> None:
        self._queue.append(row)

    def reset(self) -> None:
        self._queue.clear()

    def __call__(self, logprobs: mx.array) -> mx.array:
        n = logprobs.shape[0]
        rows, self._queue = self._queue[:n], self._queue[n:]
        if len(rows) != n:
            raise RuntimeError(f"sampler got {n} rows but {len(rows)} were prepared")
        u = mx.array(np.stack([r.uniforms() for r in rows]).astype(np.float32))
        modes = [r.params.mirostat for r in rows]
        if all(m == modes[0] for m in modes):
            return self._group(rows, logprobs, u)
        tokens = [None] * n
        for mode in sorted(set(modes)):
            idx = [i for i, m in enumerate(modes) if m == mode]
            sel = mx.array(idx)
            out = self._group([rows[i] for i in idx], logprobs[sel], u[sel])
            for j, i in enumerate(idx):
                tokens[i] = out[j:j + 1]
        return mx.concatenate(tokens, axis=0)

    # -- one group of rows sharing a mode -----------------------------------------

    def _params(self, rows) -> chain.ChainParams:
        # keyed on the row objects themselves (held, so their ids cannot be
        # reused by a later row while the entry lives)
        key = tuple(rows)
        if len(key) != len(self._chain_key) or any(a is not b for a, b in
                                                   zip(key, self._chain_key)):
            self._chain_params = chain.ChainParams.build([r.params for r in rows], self.n_vocab)
            self._chain_key = key
        return self._chain_params

    def _draw(self, rows, x, u, lo: int, mu):
        """One pass of the row group's chain with uniforms u[:, lo:lo+2];
        mirostat rows start from `mu` and return the updated one."""
        if rows[0].params.mirostat:
            mp = mirostat.MirostatParams.build([r.params for r in rows])
            return mirostat.run(x, mp, mu, u[:, lo + 1:lo + 2], self.n_vocab)
        cp = self._params(rows)
        ada = (_stack(rows, "ada_sum"), _stack(rows, "ada_total")) if cp.any_adaptive else (None, None)
        return chain.run(x, cp, u[:, lo:lo + 1], u[:, lo + 1:lo + 2], *ada), None

    def _group(self, rows, x, u) -> mx.array:
        mu = _stack(rows, "mu") if rows[0].params.mirostat else None
        drawn, mu = self._draw(rows, x, u, 0, mu)
        masks = [r.mask for r in rows]
        if any(m is not None for m in masks):
            drawn, mu = self._resample(rows, x, u, drawn, mu, masks)
        updates = self._update_state(rows, drawn, mu)
        reports = self._report(rows, drawn)
        mx.async_eval(drawn.token, *updates, *reports)
        return drawn.token

    def _resample(self, rows, x, u, first, mu_first, masks):
        """Upstream's grammar rejection sampling: keep the chain's draw when
        the grammar accepts it, else apply the grammar first and draw again
        (stateful stages advance twice then, as upstream's do)."""
        full = mx.ones((1, x.shape[-1]), dtype=mx.bool_)
        mask = mx.concatenate([m if m is not None else full for m in masks], axis=0)
        ok = mx.take_along_axis(mask, first.token[:, None].astype(mx.int32), axis=-1)
        second, mu_second = self._draw(rows, mx.where(mask, x, NEG_INF), u, 2, mu_first)
        redo = ~ok                                      # [rows, 1]
        pick = lambda a, b: mx.where(redo if a.ndim == 2 else redo[:, 0], b, a)  # noqa: E731
        width = min(first.ids.shape[-1], second.ids.shape[-1])
        drawn = chain.Drawn(
            token=pick(first.token, second.token),
            ids=pick(first.ids[:, :width], second.ids[:, :width]),
            probs=pick(first.probs[:, :width], second.probs[:, :width]),
            chosen=pick(first.chosen, second.chosen),
            p_before=pick(first.p_before, second.p_before),
        )
        mu = None if mu_first is None else mx.where(redo, mu_second, mu_first)
        return drawn, mu

    def _update_state(self, rows, drawn: chain.Drawn, mu) -> list[mx.array]:
        out = []
        for i, r in enumerate(rows):
            if mu is not None:
                r.mu = mu[i:i + 1]
                out.append(r.mu)
            elif "adaptive_p" in r.params.samplers and r.params.adaptive_target >= 0.0:
                pb = drawn.p_before[i:i + 1][:, None]
                r.ada_sum = pb + r.decay * r.ada_sum
                r.ada_total = 1.0 + r.decay * r.ada_total
                out += [r.ada_sum, r.ada_total]
        return out

    def _report(self, rows, drawn: chain.Drawn) -> list[mx.array]:
        """Queue each asking row's completion_probabilities entry."""
        out = []
        for i, r in enumerate(rows):
            n = r.params.n_probs
            if n <= 0:
                continue
            tok = drawn.token[i:i + 1]
            if r.params.post_sampling_probs:
                p = drawn.probs[i:i + 1]
                n = min(n, p.shape[-1])
                order = _top(p, n)
                ids = mx.take_along_axis(drawn.ids[i:i + 1], order, axis=-1)[0]
                ps = mx.take_along_axis(p, order, axis=-1)[0]
                tok_p = mx.take_along_axis(p, drawn.chosen[i:i + 1], axis=-1)[0]
            else:
                raw = r.raw
                n = min(n, raw.shape[-1])
                lse = mx.logsumexp(raw, axis=-1, keepdims=True)
                top = _top(raw, n)
                ids = top[0]
                ps = mx.exp(mx.take_along_axis(raw, top, axis=-1) - lse)[0]
                tok_p = mx.exp(mx.take_along_axis(raw, tok[:, None].astype(mx.int32),
                                                  axis=-1) - lse)[0]
                r.raw = None
            entry = (ids, ps, tok_p)
            r.reports.append(entry)
            out.extend(entry)
        return out

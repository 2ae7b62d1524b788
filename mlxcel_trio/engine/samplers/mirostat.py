"""Mirostat 1 and 2, vectorized over the rows that use them.

While mirostat is on, upstream's chain is only: logit bias -> temperature
(plain, no dynamic range) -> mirostat, which truncates, draws and updates
its per-sequence surprise target mu (starting at 2 * tau).  mu lives in the
sequence's state as a [1] array and is updated lazily in the same graph as
the draw; the batch sampler evaluates it with the tokens.
"""

from __future__ import annotations

import math

import attrs
import mlx.core as mx

from .chain import NEG_INF, Drawn, divide_by_temperature, draw, probs, sanitize

MIROSTAT_M = 100  # upstream's m: the top tokens used to estimate s_hat


@attrs.frozen
class MirostatParams:
    version: int
    temperature: mx.array   # [rows, 1]
    tau: mx.array
    eta: mx.array

    @classmethod
    def build(cls, params) -> "MirostatParams":
        cols = mx.array([[p.temperature, p.mirostat_tau, p.mirostat_eta] for p in params],
                        dtype=mx.float32)
        return cls(params[0].mirostat, cols[:, 0:1], cols[:, 1:2], cols[:, 2:3])


def _surprise(p_sel: mx.array) -> mx.array:
    return -mx.log2(mx.maximum(p_sel, 1e-45))


def run(x: mx.array, mp: MirostatParams, mu: mx.array, u: mx.array,
        n_vocab: int) -> tuple[Drawn, mx.array]:
    """One mirostat draw per row.  x: [rows, vocab]; mu, u: [rows, 1].
    Returns the draw and the updated mu ([rows, 1])."""
    x = sanitize(x)
    ids = mx.argsort(-x, axis=-1)
    vals = mx.take_along_axis(x, ids, axis=-1)
    keep = mx.ones(vals.shape, dtype=mx.bool_)
    vals = divide_by_temperature(vals, keep, mp.temperature)
    p = probs(vals, keep)
    pos = mx.arange(vals.shape[-1], dtype=mx.float32)[None, :]
    if mp.version == 1:
        m = min(MIROSTAT_M - 1, vals.shape[-1] - 1)
        i = mx.arange(m, dtype=mx.float32)[None, :]
        t = mx.log((i + 2.0) / (i + 1.0))
        b = mx.log(p[:, :m] / p[:, 1:m + 1])
        s_hat = mx.sum(t * b, axis=-1, keepdims=True) / mx.sum(t * t, axis=-1, keepdims=True)
        eps = s_hat - 1.0
        k = mx.power((eps * mx.power(2.0, mu)) / (1.0 - mx.power(float(n_vocab), -eps)),
                     1.0 / s_hat)
        k = mx.where(mx.isnan(k), 1.0, k)
        k = mx.clip(mx.floor(mx.minimum(k, float(vals.shape[-1]))), 1.0, None)
        keep = pos < k
    else:
        keep = (-mx.log2(mx.where(p > 0, p, 1e-45)) <= mu) | (pos == 0)
    p = probs(vals, keep)
    chosen = draw(p, u)
    p_sel = mx.take_along_axis(p, chosen, axis=-1)
    mu = mu - mp.eta * (_surprise(p_sel) - mp.tau)
    token = mx.take_along_axis(ids, chosen, axis=-1)[:, 0]
    zero = mx.zeros((x.shape[0],), dtype=mx.float32)
    return Drawn(token=token, ids=ids, probs=p, chosen=chosen, p_before=zero), mu


def initial_mu(tau: float) -> float:
    return 2.0 * tau if math.isfinite(tau) else 0.0


__all__ = ["MirostatParams", "run", "initial_mu", "NEG_INF"]

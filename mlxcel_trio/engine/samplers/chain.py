"""Upstream's default sampler chain, vectorized over the rows of a batch.

Theory of operation.  llama.cpp walks one candidate array per sequence
through its stages: top_n_sigma -> top_k -> typical -> top_p -> min_p -> xtc
-> temperature (with dynamic temperature) -> dist (or adaptive-p when the
sampler list names it).  A stage either *removes* candidates (top_k, the
truncation filters) or sets a logit to -inf while keeping the candidate
(top_n_sigma, temperature 0); the difference is visible where a stage counts
candidates (min_keep, XTC's size check, dynamic temperature's maximum
entropy), so it is kept here too.

Here every row of the batch is one candidate array.  The top_k stage sorts
once: rows keep their K best logits in descending order ([rows, K], K the
largest k any row asks for, the whole vocabulary when one row disables
top_k), and every later stage works on that sorted block with a boolean
`keep` mask and per-row parameters, so one graph serves the whole batch.
A disabled stage is skipped in Python when no row enables it.

NaN logits count as -inf, and +inf logits share the row's whole mass.  A
row where nothing finite survives draws its first candidate (upstream's
behaviour in these cases is undefined).
"""

from __future__ import annotations

import math

import attrs
import mlx.core as mx

NEG_INF = -math.inf
# adaptive-p's transform constants (upstream's)
_ADAPTIVE_WIDTH, _ADAPTIVE_PEAK, _ADAPTIVE_SHARPNESS = 0.3, 5.0, 10.0


@attrs.frozen
class ChainParams:
    """Per-row parameters as [rows, 1] columns, plus the Python-level facts
    that let a stage be skipped for the whole batch."""

    top_n_sigma: mx.array
    top_k: mx.array          # resolved: 0 / >= vocab -> K
    typical_p: mx.array
    top_p: mx.array
    min_p: mx.array
    min_keep: mx.array
    xtc_probability: mx.array
    xtc_threshold: mx.array
    temperature: mx.array
    dynatemp_range: mx.array
    dynatemp_exponent: mx.array
    adaptive: mx.array       # bool: the sampler list names adaptive_p and target >= 0
    adaptive_target: mx.array
    k: int                   # candidates kept after the top_k stage (<= vocab)
    any_sigma: bool
    any_typical: bool
    any_top_p: bool
    any_min_p: bool
    any_xtc: bool
    any_dynatemp: bool
    any_adaptive: bool

    @classmethod
    def build(cls, params, n_vocab: int) -> "ChainParams":
        """From a list of `SamplingParams` (one per row)."""
        ks = [p.top_k if 0 < p.top_k < n_vocab else n_vocab for p in params]
        cols = {
            "top_n_sigma": [p.top_n_sigma for p in params],
            "typical_p": [p.typical_p for p in params],
            "top_p": [p.top_p for p in params],
            "min_p": [p.min_p for p in params],
            "min_keep": [float(p.min_keep) for p in params],
            "xtc_probability": [p.xtc_probability for p in params],
            "xtc_threshold": [p.xtc_threshold for p in params],
            "temperature": [p.temperature for p in params],
            "dynatemp_range": [p.dynatemp_range for p in params],
            "dynatemp_exponent": [p.dynatemp_exponent for p in params],
            "adaptive_target": [p.adaptive_target for p in params],
        }
        names = list(cols)
        block = mx.array([[cols[n][i] for n in names] for i in range(len(params))],
                         dtype=mx.float32)
        split = {n: block[:, j:j + 1] for j, n in enumerate(names)}
        adaptive = [("adaptive_p" in p.samplers and p.adaptive_target >= 0.0) for p in params]
        return cls(
            top_k=mx.array(ks, dtype=mx.int32)[:, None],
            adaptive=mx.array(adaptive)[:, None],
            k=max(ks),
            any_sigma=any(p.top_n_sigma > 0.0 for p in params),
            any_typical=any(p.typical_p < 1.0 for p in params),
            any_top_p=any(p.top_p < 1.0 for p in params),
            any_min_p=any(p.min_p > 0.0 for p in params),
            any_xtc=any(p.xtc_probability > 0.0 and p.xtc_threshold <= 0.5 for p in params),
            any_dynatemp=any(p.dynatemp_range > 0.0 for p in params),
            any_adaptive=any(adaptive),
            **split,
        )


@attrs.frozen
class Drawn:
    """One draw per row: the token, and the final candidate distribution
    (upstream's cur_p after the chain) for the post-sampling report."""

    token: mx.array          # [rows] int
    ids: mx.array            # [rows, K] candidate token ids
    probs: mx.array          # [rows, K] final probabilities (0 for removed)
    chosen: mx.array         # [rows, 1] position of the token in ids
    p_before: mx.array       # [rows] adaptive-p: the pre-transform probability drawn


# -- helpers ---------------------------------------------------------------------

def sanitize(x: mx.array) -> mx.array:
    """NaN is -inf; a row holding +inf logits keeps only those, equally
    likely (a softmax over them is undefined, and their mass is all)."""
    x = mx.where(mx.isnan(x), NEG_INF, x)
    top = x == math.inf
    return mx.where(mx.any(top, axis=-1, keepdims=True), mx.where(top, 0.0, NEG_INF), x)


def probs(vals: mx.array, keep: mx.array) -> mx.array:
    """Softmax over the kept candidates; removed and -inf ones get 0."""
    masked = mx.where(keep, vals, NEG_INF)
    top = mx.max(masked, axis=-1, keepdims=True)
    top = mx.where(mx.isfinite(top), top, 0.0)
    e = mx.where(keep, mx.exp(masked - top), 0.0)
    total = mx.sum(e, axis=-1, keepdims=True)
    return e / mx.where(total > 0, total, 1.0)


def _size(keep: mx.array) -> mx.array:
    return mx.sum(keep, axis=-1, keepdims=True).astype(mx.float32)


def _rank(keep: mx.array) -> mx.array:
    """Position of each kept candidate among the kept ones (in block order)."""
    return mx.cumsum(keep.astype(mx.float32), axis=-1) - 1.0


def _first_true(cond: mx.array, default: mx.array) -> mx.array:
    """Index of the first True per row ([rows, 1]); `default` where none."""
    idx = mx.argmax(cond, axis=-1, keepdims=True).astype(mx.float32)
    return mx.where(mx.any(cond, axis=-1, keepdims=True), idx, default)


def _entropy(p: mx.array) -> mx.array:
    logp = mx.log(mx.where(p > 0, p, 1.0))
    return -mx.sum(p * logp, axis=-1, keepdims=True)


# -- stages --------------------------------------------------------------------------

def top_n_sigma(x: mx.array, n: mx.array) -> mx.array:
    """Logits below max - n * std (over the finite ones) become -inf."""
    finite = x > NEG_INF
    cnt = mx.maximum(mx.sum(finite, axis=-1, keepdims=True).astype(mx.float32), 1.0)
    xs = mx.where(finite, x, 0.0)
    mean = mx.sum(xs, axis=-1, keepdims=True) / cnt
    var = mx.sum(mx.where(finite, (x - mean) ** 2, 0.0), axis=-1, keepdims=True) / cnt
    cut = mx.max(x, axis=-1, keepdims=True) - n * mx.sqrt(var)
    on = (n > 0) & (x.shape[-1] > 1)
    return mx.where(on & (x < cut), NEG_INF, x)


def candidates(x: mx.array, k: int) -> tuple[mx.array, mx.array]:
    """The k best logits per row in descending order, and their ids."""
    if k < x.shape[-1]:
        part = mx.argpartition(-x, kth=k - 1, axis=-1)[:, :k]
        vals = mx.take_along_axis(x, part, axis=-1)
        order = mx.argsort(-vals, axis=-1)
        return mx.take_along_axis(vals, order, axis=-1), mx.take_along_axis(part, order, axis=-1)
    ids = mx.argsort(-x, axis=-1)
    return mx.take_along_axis(x, ids, axis=-1), ids


def typical(vals, keep, p_typ, min_keep):
    """Locally typical sampling: keep the candidates whose surprise is
    closest to the entropy until their mass exceeds p."""
    p = probs(vals, keep)
    h = _entropy(p)
    score = mx.abs(-mx.log(mx.where(p > 0, p, 1.0)) - h)
    big = float(3.0e38)
    key = mx.where(keep, mx.where(p > 0, score, big), math.inf)
    order = mx.argsort(key, axis=-1)
    cum = mx.cumsum(mx.take_along_axis(p, order, axis=-1), axis=-1)
    pos = mx.arange(vals.shape[-1], dtype=mx.float32)
    ok = (cum > p_typ) & ((min_keep == 0) | (pos >= min_keep - 1))
    ok = ok & mx.take_along_axis(keep, order, axis=-1)
    last = _first_true(ok, _size(keep) - 1.0) + 1.0
    # the inverse permutation, by a scatter rather than a second sort
    rank = mx.put_along_axis(mx.zeros(order.shape, dtype=mx.float32), order,
                             mx.broadcast_to(pos[None, :], order.shape), axis=-1)
    return mx.where(p_typ < 1.0, keep & (rank < last), keep)


def top_p(vals, keep, p_top, min_keep):
    """Nucleus: the shortest prefix (by logit) whose mass reaches p, and at
    least min_keep candidates."""
    p = probs(vals, keep)
    cum = mx.cumsum(p, axis=-1)
    count = _rank(keep) + 1.0
    ok = keep & (cum >= p_top) & (count >= min_keep)
    pos = mx.arange(vals.shape[-1], dtype=mx.float32)
    last = _first_true(ok, float(vals.shape[-1]))
    return mx.where(p_top < 1.0, keep & (pos <= last), keep)


def min_p(vals, keep, p_min, min_keep):
    """Keep logits >= max + log(p), topped up to min_keep by rank."""
    top = mx.max(mx.where(keep, vals, NEG_INF), axis=-1, keepdims=True)
    cut = top + mx.log(mx.where(p_min > 0, p_min, 1.0))
    kept = keep & ((vals >= cut) | (_rank(keep) < min_keep))
    return mx.where(p_min > 0.0, kept, keep)


def xtc(vals, keep, probability, threshold, min_keep, chance):
    """Exclude Top Choices: with the given chance, drop every candidate at or
    above the threshold except the least likely of them."""
    p = probs(vals, keep)
    n_above = mx.sum(keep & (p >= threshold), axis=-1, keepdims=True).astype(mx.float32)
    last = mx.maximum(n_above - 1.0, 0.0)
    size = _size(keep)
    on = ((probability > 0) & (threshold <= 0.5) & (size >= 2) & (chance <= probability)
          & (size - last >= min_keep) & (last > 0))
    return mx.where(on, keep & (_rank(keep) >= last), keep)


def divide_by_temperature(vals, keep, t):
    """Divide by t; t <= 0 keeps only the (first) best logit finite."""
    masked = mx.where(keep, vals, NEG_INF)
    best = mx.argmax(masked, axis=-1, keepdims=True)
    pos = mx.arange(vals.shape[-1])[None, :]
    greedy = mx.where(pos == best, vals, NEG_INF)
    t_safe = mx.where(t > 0, t, 1.0)
    # an infinite temperature is uniform over the finite candidates
    scaled = mx.where(vals > NEG_INF, vals / t_safe, NEG_INF)
    return mx.where(t <= 0, greedy, scaled)


def temperature(vals, keep, temp, dyn_range, dyn_exp, any_dynatemp: bool):
    """temp_ext: dynamic temperature from the normalized entropy when the
    range is positive, else a plain temperature."""
    if not any_dynatemp:
        return divide_by_temperature(vals, keep, temp)
    size = _size(keep)
    p = probs(vals, keep)
    norm = _entropy(p) / mx.log(mx.maximum(size, 2.0))
    lo = mx.maximum(temp - dyn_range, 0.0)
    hi = temp + dyn_range
    dyn = lo + (hi - lo) * mx.power(norm, dyn_exp)
    dynamic = mx.where(size <= 1, vals, divide_by_temperature(vals, keep, dyn))
    return mx.where(dyn_range > 0, dynamic, divide_by_temperature(vals, keep, temp))


def adaptive_transform(vals, keep, target, weighted_sum, total_weight):
    """adaptive-p: map each candidate's probability to a logit peaking at
    the EMA-adapted target.  Returns (transformed logits, original probs)."""
    p = probs(vals, keep)
    t = mx.clip(target, 0.0, 1.0)
    adapted = mx.where(total_weight == 0, t, 2.0 * t - weighted_sum / total_weight)
    adapted = mx.clip(adapted, 0.0, 1.0)
    d = mx.abs(p - adapted) / _ADAPTIVE_WIDTH
    logit = _ADAPTIVE_PEAK - _ADAPTIVE_SHARPNESS * d * d / (1.0 + d)
    return mx.where(vals > NEG_INF, logit, NEG_INF), p


def draw(p: mx.array, u: mx.array) -> mx.array:
    """Inverse-CDF draw, as upstream's dist: the first candidate whose
    running mass reaches u * total.  Returns [rows, 1] positions."""
    cum = mx.cumsum(p, axis=-1)
    target = u * cum[:, -1:]
    ok = (cum >= target) & (p > 0)
    return mx.argmax(ok, axis=-1, keepdims=True)


# -- the chain -------------------------------------------------------------------------

_ARRAYS = ("top_n_sigma", "top_k", "typical_p", "top_p", "min_p", "min_keep",
           "xtc_probability", "xtc_threshold", "temperature", "dynatemp_range",
           "dynatemp_exponent", "adaptive", "adaptive_target")
_STATIC = ("k", "any_sigma", "any_typical", "any_top_p", "any_min_p", "any_xtc",
           "any_dynatemp", "any_adaptive")
_COMPILED: dict[tuple, object] = {}


def run(x: mx.array, cp: ChainParams, u_xtc: mx.array, u_dist: mx.array,
        ada_sum: mx.array | None = None, ada_total: mx.array | None = None) -> Drawn:
    """The default chain on x ([rows, vocab] logits or log-probabilities),
    one draw per row.  u_xtc / u_dist are [rows, 1] uniforms in [0, 1).

    The graph is built once per combination of enabled stages and compiled
    with mx.compile (MLX fuses its elementwise steps: ~3x faster than the
    op-by-op graph on a CPU); per-row parameters are inputs, so a batch with
    new rows reuses it."""
    static = tuple(getattr(cp, f) for f in _STATIC)
    fn = _COMPILED.get(static)
    if fn is None:
        def traced(x, u_xtc, u_dist, ada_sum, ada_total, *arrays):
            params = attrs.evolve(cp, **dict(zip(_ARRAYS, arrays)))
            d = _run(x, params, u_xtc, u_dist, ada_sum, ada_total)
            return d.token, d.ids, d.probs, d.chosen, d.p_before
        fn = _COMPILED[static] = mx.compile(traced)
    if ada_sum is None:
        ada_sum = ada_total = mx.zeros((x.shape[0], 1), dtype=mx.float32)
    out = fn(x, u_xtc, u_dist, ada_sum, ada_total, *(getattr(cp, f) for f in _ARRAYS))
    return Drawn(*out)


def _run(x, cp, u_xtc, u_dist, ada_sum, ada_total) -> Drawn:
    x = sanitize(x)
    if cp.any_sigma:
        x = top_n_sigma(x, cp.top_n_sigma)
    vals, ids = candidates(x, cp.k)
    pos = mx.arange(vals.shape[-1], dtype=mx.int32)[None, :]
    keep = pos < cp.top_k
    if cp.any_typical:
        keep = typical(vals, keep, cp.typical_p, cp.min_keep)
    if cp.any_top_p:
        keep = top_p(vals, keep, cp.top_p, cp.min_keep)
    if cp.any_min_p:
        keep = min_p(vals, keep, cp.min_p, cp.min_keep)
    if cp.any_xtc:
        keep = xtc(vals, keep, cp.xtc_probability, cp.xtc_threshold, cp.min_keep, u_xtc)
    vals = temperature(vals, keep, cp.temperature, cp.dynatemp_range, cp.dynatemp_exponent,
                       cp.any_dynatemp)
    p_before = mx.zeros((x.shape[0],), dtype=mx.float32)
    if cp.any_adaptive:
        shaped, p0 = adaptive_transform(vals, keep, cp.adaptive_target, ada_sum, ada_total)
        vals = mx.where(cp.adaptive, shaped, vals)
    p = probs(vals, keep)
    chosen = draw(p, u_dist)
    if cp.any_adaptive:
        p_before = mx.take_along_axis(p0, chosen, axis=-1)[:, 0]
    token = mx.take_along_axis(ids, chosen, axis=-1)[:, 0]
    return Drawn(token=token, ids=ids, probs=p, chosen=chosen, p_before=p_before)

"""Small numpy reference implementations of llama.cpp's sampler stages.

Written from upstream's definitions (src/llama-sampler.cpp at the reference
commit), one candidate list per call, the way upstream walks its
llama_token_data_array: a stage either shortens the list (removes
candidates) or sets a logit to -inf while keeping the candidate.  Slow and
literal on purpose; the engine's vectorized chain is checked against these.

A candidate list is a list of [token_id, logit] pairs.
"""

from __future__ import annotations

import math

import numpy as np

NEG_INF = -math.inf


def cands(logits) -> list[list]:
    return [[i, float(v)] for i, v in enumerate(logits)]


def softmax(c) -> list[float]:
    if not c:
        return []
    top = max(v for _, v in c)
    if top == NEG_INF:
        top = 0.0
    e = [math.exp(v - top) if v > NEG_INF else 0.0 for _, v in c]
    s = sum(e)
    return [x / s if s > 0 else 0.0 for x in e]


def sort_desc(c):
    return sorted(c, key=lambda t: -t[1])


def top_n_sigma(c, n):
    if n <= 0 or len(c) <= 1:
        return c
    fin = [v for _, v in c if v != NEG_INF]
    mx_ = max(v for _, v in c)
    mean = sum(fin) / len(fin) if fin else 0.0
    std = math.sqrt(sum((v - mean) ** 2 for v in fin) / len(fin)) if fin else 0.0
    return [[t, NEG_INF if v < mx_ - n * std else v] for t, v in c]


def top_k(c, k):
    if k <= 0:
        return c
    return sort_desc(c)[:min(k, len(c))]


def typical(c, p, min_keep):
    if p >= 1.0:
        return c
    c = sort_desc(c)
    probs = softmax(c)
    h = -sum(q * math.log(q) for q in probs if q > 0)
    score = [abs(-math.log(q) - h) if q > 0 else math.inf for q in probs]
    order = sorted(range(len(c)), key=lambda i: score[i])
    cum, last = 0.0, len(order)
    for i, idx in enumerate(order):
        cum += probs[idx]
        if cum > p and (min_keep == 0 or i >= min_keep - 1):
            last = i + 1
            break
    return [c[i] for i in order[:last]]


def top_p(c, p, min_keep):
    if p >= 1.0:
        return c
    c = sort_desc(c)
    probs = softmax(c)
    cum, last = 0.0, len(c)
    for i, q in enumerate(probs):
        cum += q
        if cum >= p and i + 1 >= min_keep:
            last = i + 1
            break
    return c[:last]


def min_p(c, p, min_keep):
    if p <= 0.0 or not c:
        return c
    top = max(v for _, v in c)
    cut = top + math.log(p)
    above = [x for x in c if x[1] >= cut]
    if above and len(above) >= min_keep:
        return above
    c = sort_desc(c)
    i = 1
    while i < len(c) and not (c[i][1] < cut and i >= min_keep):
        i += 1
    return c[:i]


def xtc(c, probability, threshold, min_keep, chance):
    if probability <= 0 or threshold > 0.5 or len(c) < 2 or chance > probability:
        return c
    c = sort_desc(c)
    probs = softmax(c)
    last = 0
    for i, q in enumerate(probs):
        if q >= threshold:
            last = i
        else:
            break
    if len(c) - last >= min_keep and last > 0:
        return c[last:]
    return c


def temp_impl(c, t):
    if not c:
        return c
    if t <= 0:
        best = max(range(len(c)), key=lambda i: (c[i][1], -i))
        return [[tok, v if i == best else NEG_INF] for i, (tok, v) in enumerate(c)]
    return [[tok, v / t if v > NEG_INF else NEG_INF] for tok, v in c]


def temperature(c, t, rng=0.0, exponent=1.0):
    if rng <= 0:
        return temp_impl(c, t)
    if len(c) <= 1:
        return c
    lo, hi = max(0.0, t - rng), t + rng
    probs = softmax(sort_desc(c))
    c = sort_desc(c)
    h = -sum(q * math.log(q) for q in probs if q > 0)
    dyn = lo + (hi - lo) * (h / math.log(len(c))) ** exponent
    return temp_impl(c, dyn)


def adaptive(c, target, wsum, wtot):
    """Returns (transformed candidates, original probs)."""
    probs = softmax(c)
    t = min(max(target, 0.0), 1.0)
    adapted = t if wtot == 0 else 2 * t - wsum / wtot
    adapted = min(max(adapted, 0.0), 1.0)
    out = []
    for (tok, v), q in zip(c, probs):
        if v == NEG_INF:
            out.append([tok, v])
            continue
        d = abs(q - adapted) / 0.3
        out.append([tok, 5.0 - 10.0 * d * d / (1.0 + d)])
    return out, probs


def chain(logits, p: dict, chance=1.0):
    """The default order; returns the final {token: probability}."""
    c = cands(logits)
    c = [[t, NEG_INF if math.isnan(v) else v] for t, v in c]
    mk = p.get("min_keep", 0)
    c = top_n_sigma(c, p.get("top_n_sigma", -1.0))
    c = top_k(c, p.get("top_k", 40))
    c = typical(c, p.get("typical_p", 1.0), mk)
    c = top_p(c, p.get("top_p", 0.95), mk)
    c = min_p(c, p.get("min_p", 0.05), mk)
    c = xtc(c, p.get("xtc_probability", 0.0), p.get("xtc_threshold", 0.1), mk, chance)
    c = temperature(c, p.get("temperature", 0.8), p.get("dynatemp_range", 0.0),
                    p.get("dynatemp_exponent", 1.0))
    if p.get("adaptive", False) and p.get("adaptive_target", -1.0) >= 0:
        c, _ = adaptive(c, p["adaptive_target"], p["wsum"], p["wtot"])
    return dict(zip([t for t, _ in c], softmax(c)))


def mirostat_v2(logits, temp, tau, eta, mu):
    """Final {token: p} and the mu update as a function of the drawn token."""
    c = temp_impl(sort_desc(cands(logits)), temp)
    probs = softmax(c)
    n = 0
    while n < len(c) and not (-math.log2(probs[n]) > mu if probs[n] > 0 else True):
        n += 1
    c = c[:max(n, 1)]
    dist = dict(zip([t for t, _ in c], softmax(c)))
    return dist, lambda tok: mu - eta * (-math.log2(dist[tok]) - tau)


def mirostat_v1(logits, temp, tau, eta, mu, n_vocab, m=100):
    c = temp_impl(sort_desc(cands(logits)), temp)
    probs = softmax(c)
    num = den = 0.0
    for i in range(min(m - 1, len(c) - 1)):
        t = math.log((i + 2) / (i + 1))
        b = math.log(probs[i] / probs[i + 1])
        num += t * b
        den += t * t
    s = num / den
    eps = s - 1
    k = ((eps * 2 ** mu) / (1 - n_vocab ** (-eps))) ** (1 / s)
    c = c[:max(int(k), 1)]
    dist = dict(zip([t for t, _ in c], softmax(c)))
    return dist, lambda tok: mu - eta * (-math.log2(dist[tok]) - tau)


def penalties(logits, history, last_n, repeat, freq, present):
    out = np.array(logits, dtype=np.float64)
    if last_n <= 0:
        return out
    counts: dict[int, int] = {}
    for t in history[-last_n:]:
        counts[t] = counts.get(t, 0) + 1
    for t, n in counts.items():
        v = out[t]
        v = v * repeat if v <= 0 else v / repeat
        out[t] = v - n * freq - (1 if n > 0 else 0) * present
    return out


def dry(history, breakers: dict, multiplier, base, allowed, last_n):
    """Upstream's DRY, naive: {token: penalty}.  `breakers` maps a head
    token to its list of tails (tuples)."""
    last = history[-last_n:] if last_n > 0 else []
    n = len(last)
    if n <= allowed:
        return {}
    rat = lambda i: last[n - 1 - i]  # noqa: E731
    limit = n
    for i in range(n):
        tails = breakers.get(rat(i))
        if not tails:
            continue
        longest = -1
        for tail in tails:
            if len(tail) > longest and len(tail) <= i and all(
                    tail[o] == rat(i - o - 1) for o in range(len(tail))):
                longest = len(tail)
        if longest >= 0:
            limit = i - longest
            break
    if limit < allowed:
        return {}
    counts = [0] * n
    for k in range(1, n):
        m = 0
        while m + k < n and rat(m) == rat(m + k):
            m += 1
        counts[n - 1 - k] = min(m, limit)
    best: dict[int, int] = {}
    for i in range(n - 1):
        if counts[i] >= allowed:
            tok = rat(n - 2 - i)
            best[tok] = max(best.get(tok, 0), counts[i])
    max_exp = int(88.7228391 / math.log(base)) if base > 1.000001 else 0
    out = {}
    for tok, length in best.items():
        if any(len(t) == 0 for t in breakers.get(tok, [])):
            continue
        e = length - allowed
        if max_exp > 0 and e > max_exp:
            e = max_exp
        out[tok] = multiplier * base ** e
    return out

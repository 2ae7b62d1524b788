"""Chunk reuse by shifting cached KV: upstream's --cache-reuse / n_cache_reuse.

Theory of operation.  Upstream, after the common prefix of a slot's cached
tokens and a new prompt, walks both: where at least N (the minimum chunk)
cached tokens match the prompt at its current head, it drops the cached
cells between and slides that chunk down to the prompt's position
(`seq_rm` + `seq_add`, which re-rotates the keys); where fewer match it
skips one cached token.  Everything reused this way counts as cached, and
the rest of the prompt is prefilled after it.

`plan` is that walk (vectorized: the first cached position whose next N
tokens equal the prompt's next N is the one upstream's skip-by-one reaches
first).  `Shifter` applies a plan to one stored entry's layers: values are
copied as they are, and keys, which mlx-lm stores with their rotation
applied, are rotated by the position delta of their chunk.  That is exact
for a rotation whose angle is linear in the position (standard RoPE, its
linear scaling, Llama 3's frequency table); a rotation that also scales the
keys (YaRN's or LongRoPE's magnitude) would scale them twice, so such a
model, like one whose layers keep no plain K/V (a sliding window, a
recurrent state, a quantized -ctk store), gets no shifter and `why_not`
says so at load.  As upstream, the keys of layers above the first are
reused though their context changed: the reuse is an approximation the
option opts into.

Engine thread only; runs once per admitted prompt, never per decode step.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

# (cached start, prompt start, length) of each reused run, in prompt order
Segment = tuple[int, int, int]


def plan(cached: np.ndarray, prompt: np.ndarray, n_past: int, min_chunk: int,
         limit: int) -> tuple[int, list[Segment]]:
    """(prompt tokens supplied, segments) for an entry holding `cached`
    whose first `n_past` tokens are the prompt's; at most `limit` prompt
    tokens are supplied (one is always left to evaluate)."""
    segments: list[Segment] = [(0, 0, n_past)] if n_past else []
    head_c = head_p = n_past
    n_c = len(cached)
    if min_chunk <= 0:
        return n_past, segments
    while head_c < n_c and head_p < limit:
        if limit - head_p < min_chunk or n_c - head_c < min_chunk:
            break
        want = prompt[head_p:head_p + min_chunk]
        windows = np.lib.stride_tricks.sliding_window_view(cached[head_c:], min_chunk)
        hits = np.flatnonzero((windows == want).all(axis=1))
        if not hits.size:
            break
        start = head_c + int(hits[0])
        n = min_chunk
        while start + n < n_c and head_p + n < limit and cached[start + n] == prompt[head_p + n]:
            n += 1
        segments.append((start, head_p, n))
        head_c, head_p = start + n, head_p + n
    return head_p, segments


def _rotation_of(module: Any) -> Any:
    """The layer's rotary module (attention's `rope`), or None."""
    attn = getattr(module, "self_attn", None) or getattr(module, "attention", None)
    return getattr(attn, "rope", None)


def _pure_rotation(rope: Any) -> bool:
    import mlx.nn as nn
    from mlx_lm.models import rope_utils

    from .native.layers import NativeRoPE   # nn.RoPE on a native graph node

    return type(rope) in (nn.RoPE, NativeRoPE, getattr(rope_utils, "Llama3RoPE", nn.RoPE))


class Shifter:
    """Builds an adopted cache from segments of a stored entry, re-rotating
    each chunk's keys by its position delta (one rotary module per layer)."""

    def __init__(self, ropes: Sequence[Any]) -> None:
        self._ropes = list(ropes)

    def build(self, layers: list, segments: Sequence[Segment]) -> list:
        import mlx.core as mx
        from mlx_lm.models.cache import KVCache

        out = []
        for layer, rope in zip(layers, self._ropes):
            keys, values = [], []
            for src, dst, n in segments:
                k = layer.keys[..., src:src + n, :]
                if dst != src:
                    # every position of the chunk moves by the same delta: put
                    # the positions on a batch axis so the rotation sees one
                    # token at offset `delta` each
                    k = rope(k[..., None, :], offset=dst - src)[..., 0, :]
                keys.append(k)
                values.append(layer.values[..., src:src + n, :])
            fresh = KVCache()
            fresh.keys = mx.concatenate(keys, axis=2)
            fresh.values = mx.concatenate(values, axis=2)
            fresh.offset = sum(n for _, _, n in segments)
            out.append(fresh)
        return out


def for_model(model: Any, layers: list) -> tuple[Shifter | None, str | None]:
    """(a shifter, None) when every layer of `model` keeps plain K/V under a
    pure rotation, else (None, why not)."""
    from mlx_lm.models.cache import KVCache

    kinds = {type(c).__name__ for c in layers}
    if kinds != {"KVCache"} or not all(type(c) is KVCache for c in layers):
        return None, (f"this model's KV cache keeps {', '.join(sorted(kinds))} layers; "
                      "only plain per-token K/V can be shifted")
    blocks = list(getattr(model, "layers", None) or ())
    ropes = [_rotation_of(b) for b in blocks]
    if len(ropes) != len(layers) or any(r is None for r in ropes):
        return None, "this model's attention layers expose no rotary module to re-rotate keys"
    odd = sorted({type(r).__name__ for r in ropes if not _pure_rotation(r)})
    if odd:
        return None, (f"this model's rotation ({', '.join(odd)}) also scales the keys; "
                      "re-rotating cached keys would scale them twice")
    return Shifter(ropes), None

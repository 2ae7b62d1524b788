"""Per-row rollback of a batch KV cache after a verify step.

A verify step writes the same number of positions (k + 1) into every row
of mlx-lm's left-padded batch cache, and each row keeps its own count of
them.  The batch shares one write index (`_idx`), so rows cannot simply be
cut at different lengths.  Instead: cut every row by the smallest rollback
(a plain `trim`), then shift each row that must lose more to the right by
its remainder and widen its left padding by as much.  The positions that
wrap around to the front are covered by the padding, so attention never
reads them, and each row's `offset` (its RoPE position) drops by exactly
its own rollback.

The shift copies the cache once, so it runs only when the rows' counts
differ; a uniform rollback (one row, or every row alike) is free.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache, dynamic_roll


def can_roll_back(layer) -> bool:
    """Whether `rewind` handles this layer's cache (plain attention KV)."""
    return isinstance(layer, (BatchKVCache, KVCache)) or hasattr(layer, "k_codec")


def rewind(caches: Sequence, counts: Sequence[int]) -> None:
    """Drop the last counts[i] positions of row i in every layer."""
    low = min(counts)
    extra = [c - low for c in counts]
    for layer in caches:
        if not can_roll_back(layer):  # no positions: a LoRA scale entry (engine/lora.py)
            continue
        if low:
            layer.trim(low)
        if any(extra):
            _shift_rows(layer, extra)


def _shift_rows(layer, extra: list[int]) -> None:
    shift = mx.array(extra)
    idx = layer._idx

    def roll(a: mx.array) -> mx.array:
        return dynamic_roll(a[..., :idx, :], shift[:, None], axis=2)

    if isinstance(layer.keys, tuple):      # engine/kv_cache.py's stored form
        layer.keys = tuple(roll(a) for a in layer.keys)
        layer.values = tuple(roll(a) for a in layer.values)
    else:
        layer.keys, layer.values = roll(layer.keys), roll(layer.values)
    layer.left_padding = layer.left_padding + shift
    layer.offset = layer.offset - shift

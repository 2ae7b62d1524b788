"""Per-row rollback of the batch caches after a verify step.

A verify step writes the same number of positions (k + 1) into every row
of the batch, and each row keeps its own count of them.  How a layer gives
back the rest depends on its kind (engine/cache_kinds.py):

- plain and stored KV (BatchKVCache, kv_cache.BatchStoredKVCache): the
  batch shares one write index (`_idx`), so rows cannot simply be cut at
  different lengths.  Every row is cut by the smallest rollback (a plain
  `trim`), then each row that must lose more is shifted right by its
  remainder and its left padding widened by as much.  The positions that
  wrap around to the front are covered by the padding, so attention never
  reads them, and each row's `offset` (its RoPE position) drops by exactly
  its own rollback.
- a sliding window (BatchRotatingKVCache): mlx-lm writes more than one
  position by concatenation, so after a verify step the ring is in token
  order and holds the window less one plus the k + 1 new positions.
  Dropping at most k of them from its end leaves every row its last
  max_size positions, so the same cut and shift are exact, once the buffer
  is sliced to its new end (mlx-lm's own `trim` keeps the dropped tail,
  which its next in-place write would read as the ring's newest).
- recurrent state (ArraysCache and subclasses: conv and SSM states) has no
  per-token history to cut.  `Saved` keeps each such layer's state from
  before the verify forward (the state arrays are replaced, never written
  in place, by a forward); when some row kept fewer than all positions,
  every layer goes back to before the step (the positional ones cut by
  k + 1, the recurrent ones restored) and each row's kept tokens are fed
  again in one right-padded forward, as mlx-lm prefills a batch.  That
  costs a second forward over (rows, most kept); its logits are never
  evaluated.

The shift copies a positional cache once, so it runs only when the rows'
counts differ; a uniform rollback of a model without recurrent layers (one
row, or every row alike) is free.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
from mlx_lm.models.cache import (
    ArraysCache,
    BatchKVCache,
    BatchRotatingKVCache,
    KVCache,
    RotatingKVCache,
    dynamic_roll,
)

_POSITIONAL = (BatchKVCache, KVCache, BatchRotatingKVCache, RotatingKVCache)


def _positional(layer) -> bool:
    return isinstance(layer, _POSITIONAL) or hasattr(layer, "k_codec")


def can_roll_back(layer) -> bool:
    """Whether this module rolls back a layer of this kind (a sequence's
    own cache or its batch form)."""
    return _positional(layer) or isinstance(layer, ArraysCache)


def why_not(layers: Sequence) -> str | None:
    """The layer kinds of a model whose verify steps cannot be rolled back
    (mlx-lm's CacheList, ChunkedKVCache, ...), named, or None."""
    from ..lora import AdapterRows

    bad = sorted({type(c).__name__ for c in layers
                  if not can_roll_back(c) and not isinstance(c, AdapterRows)})
    return ", ".join(bad) or None


class Saved:
    """The recurrent layers' state before a verify forward."""

    __slots__ = ("layers",)

    def __init__(self, caches: Sequence) -> None:
        # the lists are mutated by the forward and the paddings decremented
        # in place (ArraysCache.advance), so both are copied
        self.layers = [(c, list(c.cache), _copy(c.left_padding), _copy(c.lengths))
                       for c in caches if isinstance(c, ArraysCache)]

    def restore(self) -> None:
        for c, state, left_padding, lengths in self.layers:
            c.cache, c.left_padding, c.lengths = list(state), left_padding, lengths


def _copy(a: mx.array | None) -> mx.array | None:
    return None if a is None else a[...]


def prepare_verify(caches: Sequence) -> None:
    """Before a verify forward: each sliding window's ring in token order.
    mlx-lm's multi-position write does this first anyway, but its mask for
    that write is computed before it, from the rotated ring's write index,
    and so (mlx-lm 0.32) hides one cached position too many from a row
    that is still left-padded; in token order mask and write agree."""
    for layer in caches:
        if isinstance(layer, BatchRotatingKVCache):
            layer._temporal_order()


def save(caches: Sequence) -> Saved | None:
    """What `roll_back` needs of a batch with recurrent layers; None (and
    nothing copied) for one without."""
    if not any(isinstance(c, ArraysCache) for c in caches):
        return None
    return Saved(caches)


def roll_back(model, caches: Sequence, saved: Saved | None, width: int,
              kept: Sequence[Sequence[int]]) -> None:
    """After a verify forward of `width` positions per row, leave row i's
    caches holding exactly its first len(kept[i]) fed tokens, `kept[i]`."""
    counts = [width - len(k) for k in kept]
    if saved is None:
        rewind(caches, counts)
    elif any(counts):
        rewind(caches, [width] * len(kept))
        saved.restore()
        _feed(model, caches, kept)


def rewind(caches: Sequence, counts: Sequence[int]) -> None:
    """Drop the last counts[i] positions of row i in every positional layer
    (recurrent layers and the LoRA scale entry, engine/lora.py, have none)."""
    low = min(counts)
    extra = [c - low for c in counts]
    for layer in caches:
        if not _positional(layer):
            continue
        rotating = isinstance(layer, BatchRotatingKVCache)
        if low:
            layer.trim(low)
            if rotating:
                layer.keys = layer.keys[..., :layer._idx, :]
                layer.values = layer.values[..., :layer._idx, :]
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


def _feed(model, caches: Sequence, rows: Sequence[Sequence[int]]) -> None:
    """Each row's tokens through the model in one forward, right-padded to
    the longest; the caches end as if each row had been fed its own."""
    lengths = [len(r) for r in rows]
    n = max(lengths)
    padding = [n - m for m in lengths]
    padded = any(padding)
    if padded:
        for c in caches:
            c.prepare(lengths=lengths, right_padding=padding)
    tokens = mx.array([[*r, *([r[-1]] * (n - len(r)))] for r in rows], dtype=mx.uint32)
    model(tokens, cache=list(caches))
    if padded:
        for c in caches:
            if isinstance(c, ArraysCache):
                c.lengths = None  # its left padding stays what the step left
            else:
                c.finalize()

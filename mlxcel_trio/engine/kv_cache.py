"""KV caches in a chosen storage format (-ctk / -ctv), batched.

Theory of operation.  mlx-lm's BatchGenerator takes one cache object per
layer for each inserted sequence, merges them (`merge`) into a batch cache
for prefill, grows (`extend`) and shrinks (`filter`) the decode batch as
sequences come and go, and hands a sequence's own cache back (`extract`)
when it leaves.  Its plain KVCache / BatchKVCache store K and V as they come
out of the projections.  The two classes here keep the same interface and
store each of K and V in a `KvFormat` (mlxcel_trio/protocol/kv_types.py):

- float: cast on the way in, cast back to the compute type on the way out;
- quantized: MLX affine quantization.  The cache then carries `bits` and
  `group_size`, which is how mlx-lm's attention knows to run its quantized
  kernel over the packed triples (weights, scales, biases) it is handed.

A stored tensor is always a tuple of arrays (one for float, three for
quantized) sharing their first three axes (batch, heads, positions);
quantization groups run along the last one.  So every batch operation,
which slices, pads, rolls or concatenates along batch or positions, is the
same on each part.

Engine thread only.  Nothing here is on the per-token path except
`update_and_fetch`, which mlx-lm's model code calls per layer and step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, BatchKVCache, KVCache, _BaseCache, dynamic_roll

from ..protocol.kv_types import KV_CACHE_TYPES, KvFormat

Parts = tuple  # the stored form of one tensor: tuple[mx.array, ...]


class Codec:
    """One tensor's storage: encode what the projection gives, decode what
    attention reads, allocate empty room."""

    __slots__ = ("fmt", "store")

    def __init__(self, fmt: KvFormat) -> None:
        self.fmt = fmt
        self.store = getattr(mx, fmt.dtype) if fmt.dtype else None

    def __deepcopy__(self, memo) -> Codec:
        return self  # immutable; mlx-lm deep-copies batches when it splits them

    def encode(self, x: mx.array) -> Parts:
        if self.fmt.quantized:
            return tuple(mx.quantize(x, group_size=self.fmt.group_size, bits=self.fmt.bits))
        return (x.astype(self.store) if self.store is not None else x,)

    def decode(self, parts: Parts, compute: Any):
        if self.fmt.quantized:
            return parts
        return parts[0].astype(compute) if parts[0].dtype != compute else parts[0]

    def empty(self, batch: int, heads: int, n: int, dim: int, compute: Any) -> Parts:
        if self.fmt.quantized:
            groups = (batch, heads, n, dim // self.fmt.group_size)
            return (mx.zeros((batch, heads, n, dim * self.fmt.bits // 32), mx.uint32),
                    mx.zeros(groups, compute), mx.zeros(groups, compute))
        return (mx.zeros((batch, heads, n, dim), self.store or compute),)


def _each(parts: Parts, f: Callable[[mx.array], mx.array]) -> Parts:
    return tuple(f(a) for a in parts)


def _positions(parts: Parts) -> int:
    return parts[0].shape[2]


def _nbytes(*tensors: Parts | None) -> int:
    return sum(a.nbytes for t in tensors if t is not None for a in t)


class _Formats:
    """What both classes share: the two codecs, and the attributes mlx-lm's
    attention reads to pick its quantized kernel (set only when quantized,
    since it tests with hasattr)."""

    def _set_formats(self, k: Codec, v: Codec) -> None:
        self.k_codec, self.v_codec = k, v
        if k.fmt.quantized:
            self.bits = k.fmt.bits
            self.group_size = k.fmt.group_size


class StoredKVCache(_Formats, _BaseCache):
    """One sequence's cache (what `extract` returns and the prompt cache
    keeps).  The batch path never writes into it: it is merged first."""

    def __init__(self, k: Codec, v: Codec) -> None:
        self._set_formats(k, v)
        self.keys: Parts | None = None
        self.values: Parts | None = None
        self.offset = 0

    def update_and_fetch(self, keys, values):
        k, v = self.k_codec.encode(keys), self.v_codec.encode(values)
        if self.keys is not None:
            k = tuple(mx.concatenate([a, b], axis=2) for a, b in zip(self.keys, k))
            v = tuple(mx.concatenate([a, b], axis=2) for a, b in zip(self.values, v))
        self.keys, self.values = k, v
        self.offset = _positions(k)
        return self.k_codec.decode(k, keys.dtype), self.v_codec.decode(v, values.dtype)

    def prefix(self, n: int) -> StoredKVCache:
        """A fresh cache over the first n positions (new array objects)."""
        out = StoredKVCache(self.k_codec, self.v_codec)
        out.keys = _each(self.keys, lambda a: a[..., :n, :])
        out.values = _each(self.values, lambda a: a[..., :n, :])
        out.offset = n
        return out

    @property
    def state(self):
        return self.keys, self.values

    def size(self) -> int:
        return self.offset

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self.offset, n)
        self.offset -= n
        self.keys = _each(self.keys, lambda a: a[..., :self.offset, :])
        self.values = _each(self.values, lambda a: a[..., :self.offset, :])
        return n

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        return _nbytes(self.keys, self.values)

    @classmethod
    def merge(cls, caches: Sequence[StoredKVCache]) -> BatchStoredKVCache:
        return BatchStoredKVCache.merge(caches)


class BatchStoredKVCache(_Formats, BatchKVCache):
    """mlx-lm's BatchKVCache (left-padded rows, `_idx` positions written)
    over stored tuples instead of plain arrays."""

    def __init__(self, left_padding: list[int], k: Codec, v: Codec) -> None:
        super().__init__(left_padding)
        self._set_formats(k, v)

    def update_and_fetch(self, keys, values):
        prev, n = self._idx, keys.shape[2]
        if self.keys is None or prev + n > _positions(self.keys):
            b, h, _, dk = keys.shape
            room = (self.step + n - 1) // self.step * self.step
            new_k = self.k_codec.empty(b, h, room, dk, keys.dtype)
            new_v = self.v_codec.empty(b, h, room, values.shape[3], keys.dtype)
            if self.keys is None:
                self.keys, self.values = new_k, new_v
            else:
                self.keys = tuple(mx.concatenate([a[..., :prev, :], z], axis=2)
                                  for a, z in zip(self.keys, new_k))
                self.values = tuple(mx.concatenate([a[..., :prev, :], z], axis=2)
                                    for a, z in zip(self.values, new_v))
        self.offset = self.offset + n
        self._idx += n
        for store, new in ((self.keys, self.k_codec.encode(keys)),
                           (self.values, self.v_codec.encode(values))):
            for a, b in zip(store, new):
                a[..., prev:self._idx, :] = b
        idx = self._idx
        return (self.k_codec.decode(_each(self.keys, lambda a: a[..., :idx, :]), keys.dtype),
                self.v_codec.decode(_each(self.values, lambda a: a[..., :idx, :]), values.dtype))

    def finalize(self) -> None:
        if self._right_padding is not None:
            shift = self._right_padding[:, None]
            self.keys = _each(self.keys, lambda a: dynamic_roll(a, shift, axis=2))
            self.values = _each(self.values, lambda a: dynamic_roll(a, shift, axis=2))
            self.offset = self.offset - self._right_padding
            self.left_padding += self._right_padding
            self._right_padding = None

    def filter(self, batch_indices) -> None:
        if self.keys is not None:
            self.keys = _each(self.keys, lambda a: a[batch_indices])
            self.values = _each(self.values, lambda a: a[batch_indices])
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        cut = min(self.left_padding.tolist())
        if cut > 0:
            if self.keys is not None:
                self.keys = _each(self.keys, lambda a: a[..., cut:, :])
                self.values = _each(self.values, lambda a: a[..., cut:, :])
            self._idx -= cut
            self.left_padding -= cut

    def extend(self, other: BatchStoredKVCache) -> None:
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        ref = self if self.keys is not None else other
        idx = max(self._idx, other._idx)
        size = max(_positions(c.keys) for c in (self, other) if c.keys is not None)

        def aligned(c: BatchStoredKVCache):
            # right-justify each row's written positions at `idx`, all `size` long
            k, v = c.keys, c.values
            if k is None:
                rows = c.offset.shape[0]
                k = _each(ref.keys, lambda a: mx.zeros((rows, a.shape[1], 0, a.shape[3]), a.dtype))
                v = _each(ref.values, lambda a: mx.zeros((rows, a.shape[1], 0, a.shape[3]), a.dtype))
            left = idx - c._idx
            right = size - _positions(k) - left
            if right < 0:
                k = _each(k, lambda a: a[..., :right, :])
                v = _each(v, lambda a: a[..., :right, :])
                right = 0
            if left or right:
                pad = [(0, 0), (0, 0), (left, right), (0, 0)]
                k = _each(k, lambda a: mx.pad(a, pad))
                v = _each(v, lambda a: mx.pad(a, pad))
            return k, v, c.offset, c.left_padding + left

        (k1, v1, o1, l1), (k2, v2, o2, l2) = aligned(self), aligned(other)
        self.keys = tuple(mx.concatenate([a, b]) for a, b in zip(k1, k2))
        self.values = tuple(mx.concatenate([a, b]) for a, b in zip(v1, v2))
        self.offset = mx.concatenate([o1, o2])
        self.left_padding = mx.concatenate([l1, l2])
        self._idx = idx

    def extract(self, idx: int) -> StoredKVCache:
        pad = self.left_padding.tolist()[idx]
        out = StoredKVCache(self.k_codec, self.v_codec)
        out.keys = _each(self.keys, lambda a: mx.contiguous(a[idx:idx + 1, :, pad:self._idx]))
        out.values = _each(self.values, lambda a: mx.contiguous(a[idx:idx + 1, :, pad:self._idx]))
        out.offset = self._idx - pad
        return out

    @classmethod
    def merge(cls, caches: Sequence[StoredKVCache]) -> BatchStoredKVCache:
        first = caches[0]
        lengths = [c.offset for c in caches]
        longest = max(lengths)
        padding = [longest - n for n in lengths]
        out = cls(padding if longest else [0] * len(caches), first.k_codec, first.v_codec)
        if longest == 0:
            return out
        ref = next(c for c in caches if c.keys is not None)
        rows = len(caches)

        def stack(get: Callable[[StoredKVCache], Parts]) -> Parts:
            parts = _each(get(ref), lambda a: mx.zeros((rows, a.shape[1], longest, a.shape[3]),
                                                       a.dtype))
            for i, (p, c) in enumerate(zip(padding, caches)):
                if c.keys is not None:
                    for dst, src in zip(parts, get(c)):
                        dst[i:i + 1, :, p:p + c.offset] = src[..., :c.offset, :]
            return parts

        out.keys, out.values = stack(lambda c: c.keys), stack(lambda c: c.values)
        out.offset = out.offset + longest
        out._idx = longest
        return out

    @property
    def nbytes(self) -> int:
        return _nbytes(self.keys, self.values)


class CacheFactory:
    """Per-layer caches for one new sequence, in the configured formats.

    With both types at the default the model's own `make_cache` (or
    mlx-lm's plain KVCache) is used untouched, so the default path costs
    nothing."""

    def __init__(self, model, cache_type_k: str, cache_type_v: str) -> None:
        from mlx_lm.models.cache import make_prompt_cache

        self._model = model
        self._make = make_prompt_cache
        fk, fv = KV_CACHE_TYPES[cache_type_k], KV_CACHE_TYPES[cache_type_v]
        self.default = fk == KvFormat() and fv == KvFormat()
        self._codecs = (Codec(fk), Codec(fv))
        self.names = (cache_type_k, cache_type_v)

    def check(self) -> str | None:
        """Why this model's caches cannot take the formats, or None.  The
        plain attention layers take them; a recurrent layer (ArraysCache:
        no per-token K/V) and a sliding window stay as they are."""
        if self.default:
            return None
        return layers_problem(self.names, self._make(self._model))

    def summary(self) -> str:
        """Which layers store the formats and which keep their own (the
        load line: never silent about a layer left in the float type)."""
        return layers_summary(self.names, self._make(self._model), compute_type(self._model))

    def __call__(self) -> list | None:
        """Fresh caches, or None to let mlx-lm build its default ones."""
        if self.default:
            return None
        return [StoredKVCache(*self._codecs) if type(c) is KVCache else c
                for c in self._make(self._model)]

    def layers(self) -> list:
        """Fresh caches of the kind a new sequence gets (for inspection)."""
        return self() or self._make(self._model)


# The kinds that stay as the model makes them when -ctk / -ctv name another
# format, and why (the load line's words).  mlx-lm has no quantized or
# retyped form of its sliding-window ring (RotatingKVCache.to_quantized is
# not implemented); a window's size is bounded by the window, so the bulk of
# a long context is still in the global layers, which take the format.  A
# recurrent state (ArraysCache and subclasses) has no per-token K/V at all.
_KEPT = {"RotatingKVCache": ("sliding-window", "no quantized or retyped window cache")}


def _kind(layer: Any) -> str:
    return "ArraysCache" if isinstance(layer, ArraysCache) else type(layer).__name__


def layers_problem(names: tuple[str, str], layers: list) -> str | None:
    """Why a model whose fresh caches are `layers` cannot store K and V as
    `names` (-ctk, -ctv, not both the default), or None.  Plain KV layers
    take the format; sliding windows and recurrent states keep their own
    (see _KEPT).  Refused: a layer of another kind (CacheList,
    ChunkedKVCache, ...: mlxcel-trio stores none of them), or a model with
    no plain KV layer at all, where the option would change nothing."""
    kinds = {_kind(c) for c in layers}
    other = kinds - {"KVCache", "ArraysCache", *_KEPT}
    head = f"-ctk {names[0]} -ctv {names[1]}: "
    if other:
        return (head + f"this model keeps {', '.join(sorted(other))} layers, which "
                "mlxcel-trio stores only in the model's own float type; use -ctk f16 -ctv f16")
    if "KVCache" not in kinds:
        kept = sorted(kinds & set(_KEPT))
        what = (f"every attention layer of this model is a {_KEPT[kept[0]][0]} "
                f"({kept[0]}) layer" if kept else "this model has no attention layer")
        return (head + what + ", which mlxcel-trio stores only in the model's own float "
                "type, so no layer can take this type; use -ctk f16 -ctv f16")
    return None


def layers_summary(names: tuple[str, str], layers: list, compute: str) -> str:
    """'-ctk q8_0 -ctv q8_0 on 1 of 3 layers; 2 sliding-window layers keep
    float32 (no quantized or retyped window cache)' for a model the rule
    accepted; just the formats when every layer takes them."""
    head = f"-ctk {names[0]} -ctv {names[1]}"
    taken = sum(type(c) is KVCache for c in layers)
    if taken == len(layers):
        return f"{head} on every layer"
    parts = [f"{head} on {taken} of {len(layers)} layers"]
    for kind, (what, why) in _KEPT.items():
        n = sum(_kind(c) == kind for c in layers)
        if n:
            parts.append(f"{n} {what} layer{'s' * (n > 1)} keep{'s' * (n == 1)} "
                         f"{compute} ({why})")
    n = sum(isinstance(c, ArraysCache) for c in layers)
    if n:
        parts.append(f"{n} recurrent layer{'s' * (n > 1)} keep{'s' * (n == 1)} "
                     f"{'their' if n > 1 else 'its'} own state (no per-token K/V)")
    return "; ".join(parts)


def compute_type(model: Any) -> str:
    """The float type the model computes in (what a kept window stores):
    float32 on the native kernels (their products are float32, and the
    parameters outside them were made so), else its first float parameter's."""
    from mlx.utils import tree_flatten

    from .native.layers import installed

    if installed(model):
        return "float32"
    for _, a in tree_flatten(model.parameters()):
        if mx.issubdtype(a.dtype, mx.floating):
            return str(a.dtype).removeprefix("mlx.core.")
    return "the model's float type"


def is_stored(layer: Any) -> bool:
    return isinstance(layer, StoredKVCache)


def plain_prefix(layer: KVCache, n: int) -> KVCache:
    fresh = KVCache()
    fresh.keys = layer.keys[..., :n, :]
    fresh.values = layer.values[..., :n, :]
    fresh.offset = n
    return fresh

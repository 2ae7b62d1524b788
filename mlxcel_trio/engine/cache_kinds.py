"""What the prompt cache needs to know about each kind of per-layer cache.

mlx-lm's architectures keep one cache object per layer, of a few kinds:

| kind      | mlx-lm class                   | what it holds                 | cut to m < n tokens   |
|-----------|--------------------------------|-------------------------------|-----------------------|
| kv        | KVCache                        | K/V of every position         | always (slice)        |
| stored    | kv_cache.StoredKVCache (-ctk)  | the same, in a storage format | always (slice)        |
| rotating  | RotatingKVCache (sliding win.) | K/V of the last max_size      | only while nothing    |
|           |                                | positions, a ring             | left the window       |
| arrays    | ArraysCache, MambaCache        | recurrent state (conv, SSM):  | never                 |
|           |                                | no per-token history          |                       |

All four have batch forms in mlx-lm 0.32 (BatchKVCache, BatchRotatingKVCache,
ArraysCache's own merge / filter / extend / extract) that BatchGenerator
drives, so continuous batching and LoRA (an extra entry at the end of the
cache list) work on every kind, and speculative/rollback.py rolls each kind
back after a verify step.  What does not: a quantized store for the
rotating kind (mlx-lm has none): under -ctk a window keeps the model's
float type beside the global layers' stored form, so one cache list mixes
kinds (kv_cache.layers_problem; refused before the load only when no layer
can take the type, in architectures.cache_kinds_problem).  The table of which operation comes
from mlx-lm and which is ours: docs/architecture.md.

A cache that cannot be cut is reused only whole: the prompt cache keeps
*snapshots*, each the state after exactly its tokens, and a new prompt
restarts from the longest snapshot that is a prefix of it.

`Kind` is the one small interface: `cuttable` (can the layer be cut to
any shorter length), `cut` (fresh objects over the first m positions, or a
copy at its full length: writes into it never reach the source), and the
flat arrays + metadata that the disk tier writes and reads back.

Engine thread only; nothing here runs per decode step.
"""

from __future__ import annotations

import copy
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

from ..protocol.kv_types import KV_CACHE_TYPES
from .kv_cache import Codec, StoredKVCache, plain_prefix


class Kind:
    name = ""

    def cuttable(self, layer: Any) -> bool:
        """Whether `cut(layer, m)` is exact for every m below its length."""
        return True

    def cut(self, layer: Any, m: int) -> Any:
        raise NotImplementedError

    def arrays(self, layer: Any) -> tuple[dict[str, mx.array], dict[str, str]]:
        raise NotImplementedError

    def restore(self, arrays: dict[str, mx.array], meta: dict[str, str]) -> Any:
        raise NotImplementedError


class _Plain(Kind):
    name = "kv"

    def cut(self, layer: KVCache, m: int) -> KVCache:
        return plain_prefix(layer, m)

    def arrays(self, layer):
        n = layer.offset
        return ({"k": layer.keys[..., :n, :], "v": layer.values[..., :n, :]},
                {"offset": str(n)})

    def restore(self, arrays, meta):
        c = KVCache()
        c.keys, c.values, c.offset = arrays["k"], arrays["v"], int(meta["offset"])
        return c


_FORMAT_NAMES = {fmt: name for name, fmt in reversed(list(KV_CACHE_TYPES.items()))}


class _Stored(Kind):
    name = "stored"

    def cut(self, layer: StoredKVCache, m: int) -> StoredKVCache:
        return layer.prefix(m)

    def arrays(self, layer):
        out = {f"k{i}": a for i, a in enumerate(layer.keys)}
        out.update({f"v{i}": a for i, a in enumerate(layer.values)})
        return out, {"offset": str(layer.offset),
                     "k_type": _FORMAT_NAMES[layer.k_codec.fmt],
                     "v_type": _FORMAT_NAMES[layer.v_codec.fmt]}

    def arrays_meta_names(self, layer: StoredKVCache) -> tuple[str, str]:
        return _FORMAT_NAMES[layer.k_codec.fmt], _FORMAT_NAMES[layer.v_codec.fmt]

    def restore(self, arrays, meta):
        c = StoredKVCache(Codec(KV_CACHE_TYPES[meta["k_type"]]),
                          Codec(KV_CACHE_TYPES[meta["v_type"]]))
        c.keys = tuple(arrays[f"k{i}"] for i in range(sum(k[0] == "k" for k in arrays)))
        c.values = tuple(arrays[f"v{i}"] for i in range(sum(k[0] == "v" for k in arrays)))
        c.offset = int(meta["offset"])
        return c


class _Rotating(Kind):
    name = "rotating"

    def cuttable(self, layer: RotatingKVCache) -> bool:
        # nothing has left the ring yet, and the arrays are in token order
        return layer.offset < layer.max_size and layer._idx == layer.offset

    def cut(self, layer: RotatingKVCache, m: int) -> RotatingKVCache:
        out = RotatingKVCache(layer.max_size, layer.keep)
        if layer.keys is None:
            return out
        # in token order first: a copy made mid-rotation must read as a ring
        # that starts at its oldest kept position
        k = layer._temporal_order(layer.keys)
        v = layer._temporal_order(layer.values)
        if m < layer.offset:
            k, v = k[..., :m, :], v[..., :m, :]
        else:
            k, v = k[..., :, :], v[..., :, :]
        out.keys, out.values = k, v
        out.offset = min(m, layer.offset)
        out._idx = k.shape[2]
        return out

    def arrays(self, layer):
        c = self.cut(layer, layer.offset)
        return ({"k": c.keys, "v": c.values},
                {"offset": str(c.offset), "max_size": str(c.max_size), "keep": str(c.keep)})

    def restore(self, arrays, meta):
        c = RotatingKVCache(int(meta["max_size"]), int(meta["keep"]))
        c.keys, c.values, c.offset = arrays["k"], arrays["v"], int(meta["offset"])
        c._idx = c.keys.shape[2]
        return c


class _Arrays(Kind):
    name = "arrays"

    def cuttable(self, layer: ArraysCache) -> bool:
        return False

    def cut(self, layer: ArraysCache, m: int) -> ArraysCache:
        out = copy.copy(layer)  # keeps the subclass (MambaCache) and its size
        out.cache = [a[...] if a is not None else None for a in layer.cache]
        out.left_padding = None
        out.lengths = None
        return out

    def arrays(self, layer):
        present = {f"s{i}": a for i, a in enumerate(layer.cache) if a is not None}
        return present, {"size": str(len(layer.cache))}

    def restore(self, arrays, meta):
        c = ArraysCache(int(meta["size"]))
        c.cache = [arrays.get(f"s{i}") for i in range(int(meta["size"]))]
        return c


KINDS: dict[type, Kind] = {KVCache: _Plain(), StoredKVCache: _Stored(),
                           RotatingKVCache: _Rotating()}
_ARRAYS = _Arrays()
BY_NAME: dict[str, Kind] = {k.name: k for k in (*KINDS.values(), _ARRAYS)}


def kind_of(layer: Any) -> Kind | None:
    """The layer's kind, or None for one the prompt cache does not handle
    (CacheList, ChunkedKVCache, ...)."""
    kind = KINDS.get(type(layer))
    if kind is None and isinstance(layer, ArraysCache):
        kind = _ARRAYS
    return kind


def supported(layers: list) -> bool:
    return bool(layers) and all(kind_of(c) is not None for c in layers)


def cuttable(layers: list) -> bool:
    """Whether every layer can be cut to any shorter prefix (a snapshot is
    then as good as one at each of its prefixes)."""
    return all(kind_of(c).cuttable(c) for c in layers)


def cut(layers: list, m: int) -> list:
    return [kind_of(c).cut(c, m) for c in layers]


def lengths(layers: list) -> set[int]:
    """The token counts the layers say they hold (recurrent ones say none)."""
    return {c.offset for c in layers if not isinstance(c, ArraysCache)}


def arrays_of(layers: list) -> list[mx.array]:
    """Every array the layers hold (what must be evaluated to detach them)."""
    out = []
    for c in layers:
        out += [a for a in kind_of(c).arrays(c)[0].values()]
    return out


def layout_of(layers: list) -> str:
    """The cache kind of each layer (and a stored one's formats): a file
    written under another layout cannot be restored into this model."""
    def one(c) -> str:
        kind = kind_of(c)
        if kind.name == "stored":
            return "stored:" + "/".join(kind.arrays_meta_names(c))
        return kind.name
    return ",".join(one(c) for c in layers)

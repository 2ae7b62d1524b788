"""LoRA adapters served unfused, with a scale per adapter per sequence.

Every projection any adapter targets is replaced by an `AdaptedLinear` that
keeps the base layer and holds all loaded adapters' matrices side by side
(their ranks concatenated: A (in, R), B (R, out)).  A forward adds

    ((x @ A) * S) @ B        S: (batch, R), one row per sequence

where a column of S is the row's scale for the adapter that column belongs
to times that adapter's own scaling (mlx-lm scale, or PEFT alpha / r).  One
pair of matrix products serves every adapter and every mix of scales, so
sequences with different mixes decode in one batch.

The scales travel with the sequence the way its KV cache does, because they
are an entry of its cache list: `AdapterRows`, appended after the layers'
caches, answers mlx-lm's batch-cache protocol (merge, filter, extend,
extract, prepare, finalize), so every batch mlx-lm assembles, splits or
shrinks carries its rows' scales in the same order as its KV.  The model
wrapper (`AdaptedModel`) takes that entry off the list before the model sees
it and publishes the batch's scales to the layers for that one forward.

A forward whose rows are all at scale 0 adds no operation at all, so a
server holding unapplied adapters computes exactly the base model.
"""

from __future__ import annotations

from typing import Any, Sequence

import mlx.core as mx
import mlx.nn as nn

from .lora_files import Adapter, AdapterError

Scales = tuple[float, ...]


class AdapterRows:
    """One scale vector per sequence of a batch (a single sequence before
    mlx-lm merges it into one), kept as an entry of the cache list."""

    def __init__(self, rows: Sequence[Scales]) -> None:
        self.rows = list(rows)

    @property
    def active(self) -> bool:
        return any(s for row in self.rows for s in row)

    # -- mlx-lm's batch-cache protocol ---------------------------------------
    def merge(self, caches: Sequence[AdapterRows]) -> AdapterRows:
        return AdapterRows([row for c in caches for row in c.rows])

    def filter(self, keep: Sequence[int]) -> None:
        self.rows = [self.rows[i] for i in keep]

    def extend(self, other: AdapterRows) -> None:
        self.rows.extend(other.rows)

    def extract(self, idx: int) -> AdapterRows:
        return AdapterRows([self.rows[idx]])

    def prepare(self, **_: Any) -> None:
        pass

    def finalize(self) -> None:
        pass

    @property
    def state(self) -> list:
        return []

    @property
    def nbytes(self) -> int:
        return 0


def split_rows(layers: list | None) -> tuple[list | None, AdapterRows | None]:
    """A cache list without its trailing `AdapterRows` entry, and the entry."""
    if layers and isinstance(layers[-1], AdapterRows):
        return layers[:-1], layers[-1]
    return layers, None


class _Forward:
    """The scales of the forward in progress, shared by every adapted layer.
    `columns` builds S for one layer's column layout, once per layout per
    forward (usually every layer shares one layout)."""

    def __init__(self) -> None:
        self._matrix: mx.array | None = None
        self._columns: dict[tuple, mx.array] = {}

    def begin(self, rows: AdapterRows | None) -> None:
        self._columns.clear()
        self._matrix = (mx.array(rows.rows, dtype=mx.float32)
                        if rows is not None and rows.active else None)

    def columns(self, layout: tuple, index: mx.array, scaling: mx.array,
                dtype: mx.Dtype) -> mx.array | None:
        if self._matrix is None:
            return None
        s = self._columns.get(layout)
        if s is None:
            s = (mx.take(self._matrix, index, axis=1) * scaling).astype(dtype)
            self._columns[layout] = s
        return s


class AdaptedLinear(nn.Module):
    """A base projection plus every adapter's low-rank term for it."""

    def __init__(self, base: nn.Module, a: mx.array, b: mx.array, index: mx.array,
                 scaling: mx.array, layout: tuple, forward: _Forward) -> None:
        super().__init__()
        self.base = base
        self.lora_a, self.lora_b = a, b
        self._index, self._scaling, self._layout = index, scaling, layout
        self._forward = forward
        self.freeze()

    def __call__(self, x: mx.array) -> mx.array:
        y = self.base(x)
        s = self._forward.columns(self._layout, self._index, self._scaling, x.dtype)
        if s is None:
            return y
        z = (x @ self.lora_a) * s.reshape(s.shape[0], *([1] * (x.ndim - 2)), s.shape[1])
        return y + (z @ self.lora_b).astype(y.dtype)


def _dims(layer: nn.Module) -> tuple[int, int] | None:
    """(in, out) of a plain or quantized linear layer; None for anything else."""
    if isinstance(layer, nn.QuantizedLinear):
        out, packed = layer.weight.shape
        return packed * 32 // layer.bits, out
    if isinstance(layer, nn.Linear):
        out, inp = layer.weight.shape
        return inp, out
    return None


def _compute_dtype(layer: nn.Module) -> mx.Dtype:
    if isinstance(layer, nn.QuantizedLinear):
        return layer.scales.dtype
    return layer.weight.dtype


class AdaptedModel:
    """The model as the batch generator calls it: the trailing `AdapterRows`
    entry of the cache list sets the scales for this forward and is not
    passed on.  Everything else is the model's own (attributes delegate)."""

    def __init__(self, model: Any, forward: _Forward) -> None:
        self.__dict__["_model"] = model
        self.__dict__["_forward"] = forward

    def __call__(self, inputs: mx.array, cache: list | None = None, **kwargs: Any):
        cache, rows = split_rows(cache)
        self._forward.begin(rows)
        try:
            return self._model(inputs, cache=cache, **kwargs)
        finally:
            self._forward.begin(None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def install(model: Any, adapters: Sequence[Adapter]) -> AdaptedModel:
    """Replace every targeted projection of `model` (in place) and return
    the wrapper the scheduler hands to mlx-lm.  Refuses, naming the adapter
    and module, a module the model does not have, that is not a linear
    layer, or whose shape the adapter's matrices do not fit."""
    named = dict(model.named_modules())
    forward = _Forward()
    targets: dict[str, list[tuple[int, Any]]] = {}
    for i, adapter in enumerate(adapters):
        for module, low in adapter.modules.items():
            layer = named.get(module)
            if layer is None:
                raise AdapterError(f"{adapter.path}: the model has no module {module}")
            dims = _dims(layer)
            if dims is None:
                raise AdapterError(f"{adapter.path}: module {module} is a "
                                   f"{type(layer).__name__}, not a linear layer")
            inp, out = dims
            if low.a.shape[0] != inp or low.b.shape[1] != out:
                raise AdapterError(
                    f"{adapter.path}: module {module} takes {inp} inputs and gives {out} "
                    f"outputs, but the adapter's matrices are {tuple(low.a.shape)} and "
                    f"{tuple(low.b.shape)} (an adapter trained for another model?)")
            targets.setdefault(module, []).append((i, low))
    replaced = []
    for module, parts in targets.items():
        base = named[module]
        dtype = _compute_dtype(base)
        a = mx.concatenate([mx.array(low.a) for _, low in parts], axis=1).astype(dtype)
        b = mx.concatenate([mx.array(low.b) for _, low in parts], axis=0).astype(dtype)
        owner = [i for i, low in parts for _ in range(low.a.shape[1])]
        scaling = [low.scaling for _, low in parts for _ in range(low.a.shape[1])]
        layout = (tuple(owner), tuple(scaling))
        replaced.append((module, AdaptedLinear(
            base, a, b, mx.array(owner, dtype=mx.int32),
            mx.array(scaling, dtype=mx.float32), layout, forward)))
    from mlx.utils import tree_unflatten

    model.update_modules(tree_unflatten(replaced))
    mx.eval([layer.parameters() for _, layer in replaced])
    return AdaptedModel(model, forward)

"""Serve a model's stored 16-bit / affine 4- and 8-bit weights on the native
kernels: `install(model)` swaps the class of each eligible nn.Linear,
nn.QuantizedLinear, nn.Embedding and nn.QuantizedEmbedding for a subclass
whose forward (and `as_linear`, a tied lm_head) calls them.

Only the classes change: parameters, their names and the module tree stay
as they were, so LoRA adapters, speculative drafts, the distributed split
and load_weights see the model they expect, on every mlx-lm architecture.
The remaining floating parameters (norms, biases, ...) are cast to float32,
so activations and the KV cache are float32, as on the float32 path.

A prefill chunk (more than 16 rows) takes the kernels' blocked product:
a register tile of tokens times a few output rows, over a float32 panel of
the weight widened (or dequantized) into L1 per block, never whole.  A
16-bit product with more than BLOCKED_ROWS rows goes through MLX instead:
the weight is widened to float32 a tile of rows at a time
(widened_product) and multiplied by the float32 BLAS, which is ahead of
the tile at that size.  An affine 4- / 8-bit product stays on the
kernels whatever its rows: dequantizing per call costs more than the
product (bench-4bit, MKL, a 64-token prefill 14 tok/s through dequantize
+ BLAS against 96 on the kernels), and prefill then computes what decode
does.

Where the kernels are MLX graph nodes (graph.cpp), the step's other ops
that MLX's CPU backend runs as generic fallbacks of several primitives each
become single nodes too: nn.RMSNorm and nn.RoPE swap classes the same way,
and a model module's `scaled_dot_product_attention` (mlx-lm's, from
models/base.py, imported into each model file) is replaced by one that
takes the decode case (one query per head, no mask) natively.  Each falls
back to MLX's op for what it does not take (ops.py).
"""

from __future__ import annotations

import importlib
import math
import sys
import types
from typing import Any

import mlx.core as mx
from mlx import nn
from mlx.utils import tree_flatten, tree_unflatten

from . import fused, library, ops

# Up to this many rows a 16-bit product runs on the kernels' register-blocked
# tile; above, MKL's sgemm on widened tiles is ahead (bench-bf16 prefill,
# 2 threads, 2026-12-07, tok/s blocked against widened: 64 tokens 111
# against 85, 512 tokens 89-90 against 87-90, 1024 tokens 58-61 against
# 61-63).
BLOCKED_ROWS = 512
TILE_BYTES = 4 << 20   # a widened weight tile for a prefill product (widened_product)
HALF = (mx.bfloat16, mx.float16)
BITS, GROUPS = (4, 8), (32, 64, 128)


def _rows(x: mx.array) -> int:
    return math.prod(x.shape[:-1])


def widened_product(x: mx.array, weight: mx.array) -> mx.array:
    """x [..., K] times a 16-bit weight [N, K] for a prefill chunk: the weight
    widened to float32 a tile of rows at a time (TILE_BYTES of float32, so
    the BLAS finds it in cache), never whole in memory."""
    x = x.astype(mx.float32)
    n, k = weight.shape
    step = max(1, TILE_BYTES // (4 * k))
    if step >= n:
        return x @ ops.widen(weight).T
    return mx.concatenate([x @ ops.widen(weight, r, min(step, n - r)).T
                           for r in range(0, n, step)], axis=-1)


class NativeLinear(nn.Linear):
    native_form = "linear"   # what fused.py looks for (it cannot import this module)

    def __call__(self, x: mx.array) -> mx.array:
        bias = self.get("bias")
        if _rows(x) <= BLOCKED_ROWS:
            return ops.gemm_16(x, self["weight"], bias)
        y = widened_product(x, self["weight"])
        return y if bias is None else y + bias


class NativeQuantizedLinear(nn.QuantizedLinear):
    native_form = "quantized_linear"   # what fused.py looks for (it cannot import this module)

    def __call__(self, x: mx.array) -> mx.array:
        return ops.gemm_affine(x, self["weight"], self["scales"], self["biases"],
                               self.group_size, self.bits, self.get("bias"))


class NativeEmbedding(nn.Embedding):
    def __call__(self, x: mx.array) -> mx.array:
        return self["weight"][x].astype(mx.float32)

    def as_linear(self, x: mx.array) -> mx.array:
        if _rows(x) <= BLOCKED_ROWS:
            return ops.gemm_16(x, self["weight"])
        return widened_product(x, self["weight"])


class NativeQuantizedEmbedding(nn.QuantizedEmbedding):
    def __call__(self, x: mx.array) -> mx.array:
        # s q + b in float32, unrounded, as the kernels compute the products
        f32 = mx.float32
        return mx.dequantize(self["weight"][x], self["scales"][x].astype(f32),
                             self["biases"][x].astype(f32), self.group_size, self.bits)

    def as_linear(self, x: mx.array) -> mx.array:
        return ops.gemm_affine(x, self["weight"], self["scales"], self["biases"],
                               self.group_size, self.bits)


class NativeRMSNorm(nn.RMSNorm):
    native_form = "rms_norm"   # what fused.py looks for (it cannot import this module)

    def __call__(self, x: mx.array) -> mx.array:
        return ops.rms_norm(x, self["weight"], self.eps)


class NativeRoPE(nn.RoPE):
    native_form = "rope"   # what fused.py looks for (it cannot import this module)

    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        return ops.rope(x, self.dims, traditional=self.traditional, base=self.base,
                        scale=self.scale, offset=offset)


def _mlx_lm_sdpa() -> Any:
    from mlx_lm.models import base

    return base.scaled_dot_product_attention


def native_sdpa(queries: mx.array, keys: mx.array, values: mx.array, cache: Any, scale: float,
                mask: mx.array | str | None, sinks: mx.array | None = None) -> mx.array:
    """mlx-lm's scaled_dot_product_attention, a decode step's natively."""
    if mask is None and sinks is None and not hasattr(cache, "bits"):
        y = ops.decode_attention(queries, keys, values, scale)
        if y is not None:
            return y
    return _mlx_lm_sdpa()(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)


class _CoreWithNativeLogSumExp(types.ModuleType):
    """mlx.core as mlx_lm.generate sees it once a model runs on the kernels:
    the same module, with logsumexp (each step's normalization of the
    logits, ~3.7 ms on MLX's scalar CPU exp for a 152k vocabulary) as the
    native node."""

    logsumexp = staticmethod(ops.logsumexp)

    def __getattr__(self, name: str) -> Any:
        return getattr(mx, name)


def _install_step_ops(model: nn.Module) -> None:
    """The norms, rotations and attention of the model on graph nodes, and
    eligible decoder layers as one node each in decode (fused.py); and
    mlx-lm's per-step logsumexp on its node, process-wide (ops.logsumexp
    falls back to MLX's for what it does not take)."""
    # (the module itself: the package's `generate` attribute is a function)
    generate = importlib.import_module("mlx_lm.generate")
    if getattr(generate, "mx", None) is mx:   # an optimization: absent, nothing changes
        generate.mx = _CoreWithNativeLogSumExp(mx.__name__)
    modules = set()
    for _, m in model.named_modules():
        if type(m) is nn.RMSNorm:
            m.__class__ = NativeRMSNorm
        elif type(m) is nn.RoPE:
            m.__class__ = NativeRoPE
        modules.add(sys.modules.get(type(m).__module__))
    fused.install(model)
    original = _mlx_lm_sdpa()
    for mod in modules:   # process-wide for that file's models: native_sdpa falls back
        if getattr(mod, "scaled_dot_product_attention", None) is original:
            mod.scaled_dot_product_attention = native_sdpa


def _affine(m: Any) -> bool:
    return (getattr(m, "mode", "affine") == "affine" and m.bits in BITS
            and m.group_size in GROUPS and m.get("biases") is not None)


def _swap_for(m: nn.Module) -> type | None:
    """The native class for a module, or None when it stays as it is."""
    if type(m) is nn.Linear and m.weight.dtype in HALF:
        return NativeLinear
    if type(m) is nn.Embedding and m.weight.dtype in HALF:
        return NativeEmbedding
    if type(m) is nn.QuantizedLinear and _affine(m):
        return NativeQuantizedLinear
    if type(m) is nn.QuantizedEmbedding and _affine(m):
        return NativeQuantizedEmbedding
    return None


def eligible(model: nn.Module) -> int:
    """How many of the model's layers the kernels would serve."""
    return sum(_swap_for(m) is not None for _, m in model.named_modules())


def installed(model: nn.Module) -> int:
    """How many of the model's layers run on the kernels now."""
    ours = (NativeLinear, NativeQuantizedLinear, NativeEmbedding, NativeQuantizedEmbedding)
    return sum(isinstance(m, ours) for _, m in model.named_modules())


def install(model: nn.Module) -> int:
    """Swap the eligible layers in place; returns how many.  Floating
    parameters outside them become float32."""
    served: set[str] = set()
    for name, m in model.named_modules():
        cls = _swap_for(m)
        if cls is not None:
            m.__class__ = cls
            served.add(name)
    def kept(key: str) -> bool:   # a served layer's stored arrays
        owner, _, leaf = key.rpartition(".")
        return owner in served and leaf in ("weight", "scales", "biases")

    cast = [(k, v.astype(mx.float32)) for k, v in tree_flatten(model.parameters())
            if mx.issubdtype(v.dtype, mx.floating) and v.dtype != mx.float32 and not kept(k)]
    if cast:
        model.update(tree_unflatten(cast))
    if library._graph is not None:
        _install_step_ops(model)
    return len(served)

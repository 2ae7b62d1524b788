"""MLX-level calls of the native kernels: y = x @ W.T (+ bias) in float32.

x is any float array [..., K] (evaluated here); the weights are the layer's
own stored arrays, read in place through their buffers (their address is
cached per array object, so a replaced weight is picked up at the next
call).  Callers check `native.available()` first.

With the MLX primitive (graph.cpp; library._graph) a product is a node of
MLX's lazy graph and nothing is evaluated here; else the kernels are called
through ctypes on the evaluated input and the product is wrapped in a new
array.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from . import library
from .library import DTYPE_CODE

_addresses: dict[int, tuple[mx.array, int]] = {}


def _address(a: mx.array) -> int:
    """The address of an evaluated row-contiguous array's data."""
    key = id(a)
    hit = _addresses.get(key)
    if hit is not None and hit[0] is a:
        return hit[1]
    view = memoryview(a)
    if not view.c_contiguous:
        raise ValueError("native kernels take row-contiguous weights")
    addr = np.frombuffer(view.cast("B"), np.uint8).ctypes.data
    if len(_addresses) > 4096:   # weights replaced many times over: forget the old ones
        _addresses.clear()
    _addresses[key] = (a, addr)
    return addr


# The last input evaluated, with its rows: a layer's projections share their
# input (q/k/v, gate/up), and each evaluation is a sync of MLX's stream
# (~0.1-0.2 ms here), so they evaluate it once.  Holding the array keeps its
# id from being reused.
_last: tuple[mx.array, np.ndarray, tuple[int, ...]] | None = None


def _rows(x: mx.array) -> tuple[np.ndarray, tuple[int, ...]]:
    global _last
    hit = _last
    if hit is not None and hit[0] is x:
        return hit[1], hit[2]
    lead = tuple(x.shape[:-1])
    x32 = x if x.dtype == mx.float32 else x.astype(mx.float32)
    x32 = x32.reshape(math.prod(lead), x.shape[-1])
    mx.eval(x32)
    rows = np.ascontiguousarray(np.asarray(x32))
    _last = (x, rows, lead)
    return rows, lead


def _bias(bias: mx.array | None) -> int | None:
    """A float32 bias is added in the kernel; another is added after it."""
    return _address(bias) if bias is not None and bias.dtype == mx.float32 else None


def _out(y: np.ndarray, lead: tuple[int, ...], bias: mx.array | None) -> mx.array:
    out = mx.array(y).reshape(*lead, y.shape[1])
    return out if bias is None or bias.dtype == mx.float32 else out + bias.astype(mx.float32)


def _dtype(a: mx.array) -> int:
    return DTYPE_CODE[str(a.dtype).removeprefix("mlx.core.")]


def _node(x: mx.array, weight: mx.array, scales: mx.array | None, biases: mx.array | None,
          bias: mx.array | None, bits: int, group: int) -> mx.array | None:
    """The product as a graph node, or None where the primitive does not
    take it (the ctypes path then does)."""
    x32 = x if x.dtype == mx.float32 else x.astype(mx.float32)
    fused = bias is not None and bias.dtype == mx.float32
    y = mx.array(0.0)   # replaced in place by the node
    rc = library._graph.mlxg_gemm(id(y), id(x32), id(weight), scales is not None and id(scales)
                                  or None, biases is not None and id(biases) or None,
                                  id(bias) if fused else None, bits, group)
    if rc != 0:
        return None
    return y if bias is None or fused else y + bias.astype(mx.float32)


def gemm_16(x: mx.array, weight: mx.array, bias: mx.array | None = None) -> mx.array:
    """x [..., K] times a bfloat16 / float16 weight [N, K]: float32 [..., N]."""
    if library._graph is not None:
        y = _node(x, weight, None, None, bias, 16, 0)
        if y is not None:
            return y
    _lib = library._lib

    xn, lead = _rows(x)
    n, k = weight.shape
    y = np.empty((xn.shape[0], n), np.float32)
    rc = _lib.mlxn_gemm_16(xn.ctypes.data, xn.shape[0], k, _address(weight), _dtype(weight),
                           n, _bias(bias), y.ctypes.data)
    if rc != 0:
        raise ValueError(f"native 16-bit product refused shape {weight.shape}")
    return _out(y, lead, bias)


def gemm_affine(x: mx.array, weight: mx.array, scales: mx.array, biases: mx.array,
                group_size: int, bits: int, bias: mx.array | None = None) -> mx.array:
    """x [..., K] times MLX's affine-quantized weight: float32 [..., N]."""
    if library._graph is not None:
        y = _node(x, weight, scales, biases, bias, bits, group_size)
        if y is not None:
            return y
    _lib = library._lib

    xn, lead = _rows(x)
    n, k = weight.shape[0], x.shape[-1]
    y = np.empty((xn.shape[0], n), np.float32)
    rc = _lib.mlxn_gemm_affine(xn.ctypes.data, xn.shape[0], k, _address(weight),
                               _address(scales), _address(biases), _dtype(scales), bits,
                               group_size, n, _bias(bias), y.ctypes.data)
    if rc != 0:
        raise ValueError(f"native {bits}-bit product refused group {group_size}, K {k}")
    return _out(y, lead, bias)


def widen(w: mx.array, row0: int = 0, rows: int | None = None) -> mx.array:
    """w[row0 : row0 + rows].astype(float32) for a stored 16-bit weight
    [N, K], over the kernels' threads (MLX's astype runs on one)."""
    rows = w.shape[0] - row0 if rows is None else rows
    g = library._graph
    if g is not None and w.dtype in (mx.bfloat16, mx.float16) and w.ndim == 2:
        y = mx.array(0.0)
        if g.mlxg_widen(id(y), id(w), row0, rows) == 0:
            return y
    return w[row0:row0 + rows].astype(mx.float32)


# A decode step's other ops as single graph nodes (graph.cpp): each falls
# back to MLX's own op where the primitive is not loaded or does not take
# the arguments (another dtype, an array offset, a mask, ...).

def rms_norm(x: mx.array, weight: mx.array | None, eps: float) -> mx.array:
    """mx.fast.rms_norm."""
    g = library._graph
    if (g is not None and weight is not None and x.dtype == mx.float32
            and weight.dtype == mx.float32):
        y = mx.array(0.0)
        if g.mlxg_rms_norm(id(y), id(x), id(weight), eps) == 0:
            return y
    return mx.fast.rms_norm(x, weight, eps)


def logsumexp(a: mx.array, axis=None, keepdims: bool = False, **kwargs) -> mx.array:
    """mx.logsumexp; one node for the last axis of a float32 array."""
    g = library._graph
    if g is not None and not kwargs and a.dtype == mx.float32 and a.ndim >= 1:
        if isinstance(axis, (list, tuple)) and len(axis) == 1:
            axis = axis[0]
        whole = axis is None and a.size == a.shape[-1]   # every axis but the last is 1
        if whole or axis in (-1, a.ndim - 1):
            y = mx.array(0.0)
            if g.mlxg_logsumexp(id(y), id(a)) == 0:
                return y if keepdims else y.reshape(()) if whole else y.squeeze(-1)
    return mx.logsumexp(a, axis=axis, keepdims=keepdims, **kwargs)


def rope(x: mx.array, dims: int, *, traditional: bool, base: float | None, scale: float,
         offset: int | mx.array, freqs: mx.array | None = None) -> mx.array:
    """mx.fast.rope."""
    g = library._graph
    if (g is not None and freqs is None and base is not None and type(offset) is int
            and x.dtype == mx.float32):
        y = mx.array(0.0)
        if g.mlxg_rope(id(y), id(x), dims, int(traditional), base, scale, offset) == 0:
            return y
    return mx.fast.rope(x, dims, traditional=traditional, base=base, scale=scale,
                        offset=offset, freqs=freqs)


def decode_attention(queries: mx.array, keys: mx.array, values: mx.array,
                     scale: float) -> mx.array | None:
    """softmax(q k^T scale) v for one query per head and no mask, as one
    node; None where the primitive does not take it."""
    g = library._graph
    if g is None or queries.ndim != 4 or queries.shape[2] != 1:
        return None
    if not queries.dtype == keys.dtype == values.dtype == mx.float32:
        return None
    y = mx.array(0.0)
    return y if g.mlxg_decode_attention(id(y), id(queries), id(keys), id(values),
                                        scale) == 0 else None

"""A decode step's other ops as native graph nodes (graph.cpp): rms_norm,
rope and one-query attention equal MLX's own ops on odd shapes and strided
views, and fall back to them for what they do not take.  On the ctypes
path (no primitive) every call is MLX's op: the `kernels` fixture runs each
test on both.  Tolerances: float32 with another summation order (norm,
attention); RoPE's angles are offset * base^(-i/half) in float32 as MLX
computes them, so cos / sin of an angle near p differ by about ulp(p).
White-box: which path runs is read off the loaded primitive (library._graph,
as the `kernels` fixture sets it), and the swapped RoPE is checked against
the context shift's own test for a pure rotation (kv_shift._pure_rotation)."""

from __future__ import annotations

import io

import pytest


def _nodes(y) -> str:
    """The primitives of y's graph (its inputs evaluated first)."""
    import mlx.core as mx

    f = io.StringIO()
    mx.export_to_dot(f, y)
    return f.getvalue()


def _native(kernels) -> bool:
    from mlxcel_trio.engine.native import library

    return library._graph is not None


@pytest.mark.parametrize("shape,view", [((1, 1, 1024), None), ((3, 5, 7), None),
                                        ((2, 16, 3, 128), (0, 2, 1, 3)), ((4, 33), (1, 0))])
def test_rms_norm_equals_mlx(kernels, shape, view):
    import mlx.core as mx

    from mlxcel_trio.engine.native import ops

    x = mx.random.normal(shape, key=mx.random.key(1)) * 3
    x = x.transpose(*view) if view else x
    w = mx.random.normal((x.shape[-1],), key=mx.random.key(2))
    mx.eval(x, w)
    y = ops.rms_norm(x, w, 1e-5)
    assert ("MlxcelNativeRMSNorm" in _nodes(y)) == _native(kernels)
    assert y.shape == x.shape
    assert mx.allclose(y, mx.fast.rms_norm(x, w, 1e-5), rtol=1e-5, atol=1e-5).item()


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("shape,dims,offset", [((1, 16, 1, 128), 128, 0),
                                               ((1, 8, 1, 128), 128, 4000),
                                               ((2, 3, 5, 64), 32, 37), ((1, 7, 10), 10, 3)])
def test_rope_equals_mlx(kernels, shape, dims, offset, traditional):
    import mlx.core as mx

    from mlxcel_trio.engine.native import ops

    # a transposed view, as attention passes its queries and keys
    x = mx.random.normal((*shape[:-3], shape[-2], shape[-3], shape[-1]), key=mx.random.key(3))
    x = x.swapaxes(-2, -3)
    mx.eval(x)
    y = ops.rope(x, dims, traditional=traditional, base=10000.0, scale=1.0, offset=offset)
    ref = mx.fast.rope(x, dims, traditional=traditional, base=10000.0, scale=1.0, offset=offset)
    assert ("MlxcelNativeRoPE" in _nodes(y)) == _native(kernels)
    tol = 1e-5 + 2e-7 * (offset + x.shape[-2])
    assert y.shape == x.shape and mx.allclose(y, ref, rtol=0, atol=tol).item()


def test_rope_with_an_array_offset_or_frequencies_is_mlx_s(kernels):
    import mlx.core as mx

    from mlxcel_trio.engine.native import ops

    x = mx.random.normal((1, 4, 2, 16))
    freqs = mx.arange(1, 9, dtype=mx.float32)
    mx.eval(x, freqs)
    for kw in ({"offset": mx.array(5)}, {"offset": 5, "freqs": freqs}):
        base = None if "freqs" in kw else 10000.0
        y = ops.rope(x, 16, traditional=False, base=base, scale=1.0, **kw)
        assert "MlxcelNativeRoPE" not in _nodes(y)
        ref = mx.fast.rope(x, 16, traditional=False, base=base, scale=1.0, **kw)
        assert mx.allclose(y, ref).item()


@pytest.mark.parametrize("b,hq,hk,t,d", [(1, 16, 8, 1, 128), (1, 16, 8, 45, 128),
                                         (1, 16, 8, 600, 128), (2, 4, 1, 9, 40)])
def test_decode_attention_equals_mlx(kernels, b, hq, hk, t, d):
    import mlx.core as mx

    from mlxcel_trio.engine.native import layers

    q = mx.random.normal((b, hq, 1, d), key=mx.random.key(4))
    # the cache's keys and values: the first t steps of a longer buffer
    kb = mx.random.normal((b, hk, t + 7, d), key=mx.random.key(5)) * 2
    vb = mx.random.normal((b, hk, t + 7, d), key=mx.random.key(6))
    k, v = kb[:, :, :t], vb[:, :, :t]
    mx.eval(q, k, v)
    scale = d ** -0.5
    y = layers.native_sdpa(q, k, v, None, scale=scale, mask=None)
    assert ("MlxcelNativeDecodeAttention" in _nodes(y)) == _native(kernels)
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)
    assert y.shape == ref.shape and mx.allclose(y, ref, rtol=1e-5, atol=1e-5).item()


def test_attention_with_a_mask_or_several_queries_is_mlx_s(kernels):
    import mlx.core as mx

    from mlxcel_trio.engine.native import layers

    q = mx.random.normal((1, 4, 3, 16))
    k, v = mx.random.normal((1, 2, 3, 16)), mx.random.normal((1, 2, 3, 16))
    mx.eval(q, k, v)
    for qq, mask in ((q, "causal"), (q[:, :, :1], mx.array([[True, False, True]]))):
        y = layers.native_sdpa(qq, k, v, None, scale=0.25, mask=mask)
        assert "MlxcelNativeDecodeAttention" not in _nodes(y)
        ref = mx.fast.scaled_dot_product_attention(qq, k, v, scale=0.25, mask=mask)
        assert mx.allclose(y, ref).item()


@pytest.mark.parametrize("shape,axis,keepdims", [((1, 151936), -1, True), ((1, 151936), None, True),
                                                 ((1, 151936), None, False), ((3, 5, 33), 2, False),
                                                 ((7,), -1, True), ((4, 17), (1,), True)])
def test_logsumexp_equals_mlx(kernels, shape, axis, keepdims):
    import mlx.core as mx

    from mlxcel_trio.engine.native import ops

    x = mx.random.normal(shape, key=mx.random.key(4)) * 12
    mx.eval(x)
    y = ops.logsumexp(x, axis=axis, keepdims=keepdims)
    ref = mx.logsumexp(x, axis=axis, keepdims=keepdims)
    assert ("MlxcelNativeLogSumExp" in _nodes(y)) == _native(kernels)
    assert y.shape == ref.shape and mx.allclose(y, ref, rtol=1e-6, atol=1e-5).item()


def test_logsumexp_keeps_mlx_s_infinities_and_nan(kernels):
    import math

    import mlx.core as mx

    from mlxcel_trio.engine.native import ops

    inf, nan = math.inf, math.nan
    rows = [[1.0, inf, 2.0] + [0.0] * 30, [-inf] * 33, [1.0, nan] + [3.0] * 31,
            [-inf, 0.0, 1.0] + [-inf] * 30, [-200.0, 0.0] + [-1e30] * 31]
    x = mx.array(rows)
    y, ref = ops.logsumexp(x, axis=-1), mx.logsumexp(x, axis=-1)
    assert ("MlxcelNativeLogSumExp" in _nodes(y)) == _native(kernels)
    for got, want in zip(y.tolist(), ref.tolist()):
        assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, abs=1e-6)


def test_logsumexp_of_another_axis_or_dtype_is_mlx_s(kernels):
    import mlx.core as mx

    from mlxcel_trio.engine.native import ops

    x = mx.random.normal((3, 4, 5), key=mx.random.key(5))
    for y, ref in ((ops.logsumexp(x, axis=0), mx.logsumexp(x, axis=0)),
                   (ops.logsumexp(x), mx.logsumexp(x)),
                   (ops.logsumexp(x.astype(mx.float16), axis=-1),
                    mx.logsumexp(x.astype(mx.float16), axis=-1))):
        assert "MlxcelNativeLogSumExp" not in _nodes(y)
        assert y.shape == ref.shape and mx.allclose(y, ref).item()


def test_install_puts_norms_rotations_and_attention_on_nodes(kernels):
    import importlib

    import mlx.core as mx
    from mlx import nn
    from mlx_lm.models import base, qwen3

    from fixtures.build import ensure
    from mlxcel_trio.engine import kv_shift, weights
    from mlxcel_trio.engine.native import layers, ops
    from mlx_lm.utils import load_model

    model, _ = weights.apply(load_model(ensure("tiny-bf16"), lazy=True)[0], "keep")
    kinds = {type(m) for _, m in model.named_modules()}
    native = _native(kernels)
    assert (layers.NativeRMSNorm in kinds) == native and (nn.RMSNorm in kinds) != native
    assert (layers.NativeRoPE in kinds) == native
    assert type(model).__module__ == qwen3.__name__
    if native:
        assert qwen3.scaled_dot_product_attention is layers.native_sdpa
        rope = model.model.layers[0].self_attn.rope
        assert kv_shift._pure_rotation(rope)   # cache reuse still re-rotates its keys
        # mlx-lm's per-step normalization of the logits on the node; the rest of
        # mlx.core as it was
        generate = importlib.import_module("mlx_lm.generate")
        assert generate.mx.logsumexp is ops.logsumexp and generate.mx.array is mx.array
    assert base.scaled_dot_product_attention is not layers.native_sdpa

"""Each native kernel equals MLX's own product on random shapes.

Tolerances: the kernels widen every weight to float32 and multiply in
float32, as `x @ w.astype(float32).T` does, so only the order of the sums
differs: |error| <= 1e-4 * (|x| |w| summed over K), checked as an absolute
bound scaled by sqrt(K) on unit-normal inputs.  The affine kernels are
compared with mx.quantized_matmul on float32 activations (which uses the
unrounded s * q + b, as they do).
"""

from __future__ import annotations

import pytest

SHAPES = [(1, 1024, 3072), (1, 33, 7), (3, 1000, 17), (16, 160, 70), (64, 96, 129)]


def _close(y, ref, k):
    import mlx.core as mx

    assert y.shape == ref.shape and y.dtype == mx.float32
    err = float(mx.abs(y - ref).max())
    assert err <= 2e-5 * k ** 0.5 * max(1.0, float(mx.abs(ref).max()) / k ** 0.5), err


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_16_bit_weights_equal_mlx_matmul(kernels, dtype, m, k, n):
    import mlx.core as mx

    from mlxcel_trio.engine.native import ops

    x = mx.random.normal((m, k), key=mx.random.key(m * k))
    w = mx.random.normal((n, k), key=mx.random.key(n)).astype(getattr(mx, dtype))
    bias = mx.random.normal((n,), key=mx.random.key(1))
    _close(ops.gemm_16(x, w), x @ w.astype(mx.float32).T, k)
    _close(ops.gemm_16(x, w, bias), x @ w.astype(mx.float32).T + bias, k)


def test_leading_dimensions_and_16_bit_activations_are_taken(kernels):
    import mlx.core as mx

    from mlxcel_trio.engine.native import ops

    x = mx.random.normal((2, 3, 64)).astype(mx.bfloat16)
    w = mx.random.normal((40, 64)).astype(mx.bfloat16)
    y = ops.gemm_16(x, w)
    assert y.shape == (2, 3, 40)
    _close(y, x.astype(mx.float32) @ w.astype(mx.float32).T, 64)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("m,k,n", [(1, 1024, 300), (5, 384, 33), (64, 256, 71)])
@pytest.mark.parametrize("sdtype", ["bfloat16", "float32"])
def test_affine_weights_equal_mlx_quantized_matmul(kernels, bits, group, m, k, n, sdtype):
    import mlx.core as mx

    from mlxcel_trio.engine.native import ops

    x = mx.random.normal((m, k), key=mx.random.key(m + k))
    w = mx.random.normal((n, k), key=mx.random.key(n)).astype(getattr(mx, sdtype))
    wq, s, b = mx.quantize(w, group_size=group, bits=bits)
    ref = mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=group, bits=bits)
    _close(ops.gemm_affine(x, wq, s, b, group, bits), ref.astype(mx.float32), k)


def test_a_replaced_weight_is_read_anew(kernels):
    import mlx.core as mx
    from mlx import nn

    from mlxcel_trio.engine.native import layers

    lin = nn.Linear(64, 32, bias=False)
    lin.weight = lin.weight.astype(mx.bfloat16)
    layers.install(lin)
    x = mx.random.normal((1, 64))
    first = lin(x)
    lin.weight = (lin.weight.astype(mx.float32) * 2).astype(mx.bfloat16)
    assert mx.allclose(lin(x), 2 * first, rtol=1e-5, atol=1e-5).item()

"""Each native kernel equals MLX's own product on random shapes.

Tolerances: the kernels widen every weight to float32 and multiply in
float32, as `x @ w.astype(float32).T` does, so only the order of the sums
differs: |error| <= 1e-4 * (|x| |w| summed over K), checked as an absolute
bound scaled by sqrt(K) on unit-normal inputs.  The affine kernels are
compared with mx.quantized_matmul on float32 activations (which uses the
unrounded s * q + b, as they do) in their exact mode.  In their int16 (the
default where the CPU has VNNI) and int8 modes the activations are rounded
to integers with one scale d per 8 (4-bit) / 4 (8-bit) consecutive values
(kernels.cpp): there they equal a numpy model of that rounding to float32
summation order, and stay within the rounding's worst case,
sum_k |s q_k| d_k e (e = 1/2 for int8, 1/256 for int16), of the exact
product; a product of more than DECODE_ROWS rows (a prefill chunk) is the
exact one in every mode.
"""

from __future__ import annotations

import pytest

from tests.unit.native.conftest import affine_mode

# K % 32 of 1, 8, 18 and 16: the row kernels' whole 2L blocks (bf16 read
# split, x de-interleaved), the one-vector tail, the scalar tail
# (8, 1040, 40), (5, 1700, 30), (13, 3000, 20): rows whose x passes 32 KiB,
# read in k spans (the last one partial) and summed
SHAPES = [(1, 1024, 3072), (1, 33, 7), (3, 1000, 17), (7, 1010, 33), (2, 48, 9),
          (8, 1040, 40), (5, 1700, 30), (13, 3000, 20),
          (16, 160, 70), (64, 96, 129),
          (17, 600, 25), (100, 530, 50), (40, 7, 13),
          (1100, 40, 2000)]   # the last four: blocked (prefill) products, the last in panel groups


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


AFFINE_SHAPES = [(1, 1024, 300), (5, 384, 33), (64, 256, 71), (2, 96, 5), (1, 160, 17),
                 (17, 640, 30)]
DECODE_ROWS = 16   # more rows (a prefill chunk): the blocked products (kernels.cpp), exact in every mode
# (group, m, k, n): K a multiple of the group; K % 128 != 0 for a partial last vector
AFFINE_CASES = [(g, *mkn) for g in (32, 64, 128) for mkn in AFFINE_SHAPES if mkn[1] % g == 0]


@pytest.fixture
def exact(kernels):
    with affine_mode(kernels, "exact") as mode:
        yield mode


@pytest.fixture(params=["int8", "int16"])
def rounded(kernels, request):
    with affine_mode(kernels, request.param) as mode:
        yield mode


def _affine_case(m, k, n, group, bits, sdtype):
    import mlx.core as mx

    x = mx.random.normal((m, k), key=mx.random.key(m + k))
    w = mx.random.normal((n, k), key=mx.random.key(n)).astype(getattr(mx, sdtype))
    wq, s, b = mx.quantize(w, group_size=group, bits=bits)
    return x, wq, s, b


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group,m,k,n", AFFINE_CASES)
@pytest.mark.parametrize("sdtype", ["bfloat16", "float32"])
def test_affine_weights_equal_mlx_quantized_matmul(exact, bits, group, m, k, n, sdtype):
    import mlx.core as mx

    from mlxcel_trio.engine.native import ops

    x, wq, s, b = _affine_case(m, k, n, group, bits, sdtype)
    ref = mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=group, bits=bits)
    _close(ops.gemm_affine(x, wq, s, b, group, bits), ref.astype(mx.float32), k)


def _rounded_model(x, wq, s, b, group, bits, mode):
    """numpy: what the int8 / int16 kernels compute (float64 sums), the
    exact product, and the worst case of the activation rounding between
    them."""
    import mlx.core as mx
    import numpy as np

    x = np.asarray(x)
    m, k = x.shape
    words = np.asarray(wq)
    per = 32 // bits
    q = np.stack([(words >> (bits * j)) & (2 ** bits - 1) for j in range(per)], -1)
    q = q.reshape(words.shape[0], k).astype(np.float64)
    sf = np.repeat(np.asarray(s.astype(mx.float32)), group, 1).astype(np.float64)
    bf = np.asarray(b.astype(mx.float32)).astype(np.float64)
    lane = 8 if bits == 4 else 4              # values sharing one activation scale
    blocks = x.reshape(m, k // lane, lane)
    top = np.abs(blocks).max(-1, keepdims=True)
    inv = np.where(top > 0, np.float32(127) / np.where(top > 0, top, 1), 0).astype(np.float32)
    t = (blocks * inv).astype(np.float32)
    xq = np.rint(t)
    err = 0.5
    if mode == "int16":    # a second byte: the residual in 1/256ths
        xq = xq + np.clip(np.rint((t - xq) * np.float32(256)), -127, 127) / 256
        err = 1 / 256
    xq = xq.reshape(m, k)
    d = np.repeat((top / np.float32(127)).astype(np.float32).reshape(m, -1), lane, 1)
    gsum = x.astype(np.float64).reshape(m, k // group, group).sum(-1)
    model = (xq * d) @ (sf * q).T + gsum @ bf.T
    exact = x.astype(np.float64) @ (sf * q + np.repeat(bf, group, 1)).T
    worst = (d * err) @ np.abs(sf * q).T
    return model, exact, worst


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group,m,k,n", AFFINE_CASES)
@pytest.mark.parametrize("sdtype", ["bfloat16", "float32"])
def test_integer_affine_kernels_round_the_activations_as_stated(rounded, bits, group, m, k, n,
                                                                sdtype):
    import numpy as np

    from mlxcel_trio.engine.native import ops

    x, wq, s, b = _affine_case(m, k, n, group, bits, sdtype)
    y = np.asarray(ops.gemm_affine(x, wq, s, b, group, bits)).astype(np.float64)
    model, exact, worst = _rounded_model(x, wq, s, b, group, bits, rounded)
    scale = np.abs(model).max() + k ** 0.5
    if m > DECODE_ROWS:   # a prefill chunk's product rounds nothing
        assert np.abs(y - exact).max() <= 2e-6 * k ** 0.5 * scale
        return
    assert np.abs(y - model).max() <= 2e-6 * k ** 0.5 * scale
    assert (np.abs(y - exact) <= worst + 2e-6 * k ** 0.5 * scale).all()
    # and it is not the exact product (whose gap would be float32 rounding)
    assert np.abs(y - exact).max() > (1e-3 if rounded == "int8" else 4e-6) * np.abs(exact).max()


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

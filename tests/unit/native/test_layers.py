"""A model on the native kernels: which layers they take, and that greedy
decoding equals the float32 path's on the tiny fixtures (the bench fixtures
are compared by bench/native_decode.py: 64 tokens)."""

from __future__ import annotations

import sys

import pytest

from tests.unit.native.conftest import affine_mode

PROMPT = list(range(40, 72))
N = 24


def greedy(model) -> list[int]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    return [int(t) for t, _ in generate_step(mx.array(PROMPT), model, max_tokens=N,
                                             sampler=lambda x: mx.argmax(x, -1))]


def mlx_attention(model):
    """MLX's own attention for the model's file while in the block: the
    kernels replace it process-wide there (layers.native_sdpa)."""
    from unittest import mock

    from mlx_lm.models import base

    return mock.patch.object(sys.modules[type(model).__module__], "scaled_dot_product_attention",
                             base.scaled_dot_product_attention)


def load(path):
    from mlx_lm.utils import load_model

    return load_model(path, lazy=True)[0]


@pytest.fixture
def affine(kernels, request):
    with affine_mode(kernels, request.param) as mode:
        yield mode


# the int8 affine kernels part from it within a few tokens on tiny-4bit
# (docs/kernels.md); test_kernels.py bounds their products
@pytest.mark.parametrize("kind,affine", [("tiny-bf16", "exact"), ("tiny-4bit", "exact"),
                                         ("tiny-4bit", "int16")], indirect=["affine"])
def test_greedy_on_the_kernels_equals_the_float32_path(kernels, kind, affine, monkeypatch):
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from fixtures.build import ensure
    from mlxcel_trio.engine import kv_cache, weights
    from mlxcel_trio.engine.native import layers

    path = ensure(kind)
    model, note = weights.apply(load(path), "keep")
    assert "on the native CPU kernels" in note
    names = {type(m).__name__ for _, m in model.named_modules()}
    assert names & {"NativeLinear", "NativeQuantizedLinear"}
    assert weights.stored_form(model) is not None          # nothing was converted
    outside = [p for k, p in tree_flatten(model.parameters())
               if not k.endswith(("weight", "scales", "biases"))]
    assert all(p.dtype == mx.float32 for p in outside)     # norms: float32 activations
    # what a window kept beside a -ctk store holds (the load line names it)
    assert kv_cache.compute_type(model) == "float32"
    if kind == "tiny-bf16":
        assert kv_cache.compute_type(load(path)) == "bfloat16"
    reference, _ = weights.apply(load(path), "float32")
    tokens = greedy(model)
    with mlx_attention(reference):
        assert tokens == greedy(reference)
        # a prefill chunk (more than 16 rows) on the kernels' blocked product,
        # and past BLOCKED_ROWS, where 16-bit weights take MLX's widened path
        # (affine ones stay on the blocked product); the same logits
        x = mx.array([PROMPT[:20]])
        tol = 1e-3
        expected = reference(x)
        assert mx.allclose(model(x), expected, rtol=tol, atol=tol).item()
        monkeypatch.setattr(layers, "BLOCKED_ROWS", 8)
        assert mx.allclose(model(x), expected, rtol=tol, atol=tol).item()


def test_layers_the_kernels_do_not_take_stay_as_they_are():
    import mlx.core as mx
    from mlx import nn

    from mlxcel_trio.engine.native import layers

    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    model.layers[1].weight = model.layers[1].weight.astype(mx.bfloat16)
    q = nn.QuantizedLinear(64, 64, bits=3, group_size=64)
    assert layers.eligible(model) == 1 and layers.eligible(q) == 0
    assert layers.install(model) == 1
    assert type(model.layers[0]) is nn.Linear
    assert type(model.layers[1]) is layers.NativeLinear
    assert model.layers[1].bias.dtype == mx.float32


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_prefill_product_widens_its_weight_a_tile_at_a_time(kernels, monkeypatch, dtype):
    import mlx.core as mx

    from mlxcel_trio.engine.native import layers, ops

    w = mx.random.normal((1000, 333), key=mx.random.key(3)).astype(getattr(mx, dtype))
    mx.eval(w)
    assert mx.array_equal(ops.widen(w, 10, 500), w[10:510].astype(mx.float32)).item()
    assert mx.array_equal(ops.widen(w), w.astype(mx.float32)).item()
    x = mx.random.normal((2, 40, 333), key=mx.random.key(4))
    whole = x @ w.astype(mx.float32).T
    monkeypatch.setattr(layers, "TILE_BYTES", 4 * 333 * 64)   # 64 rows: 16 tiles, the last short
    tiled = layers.widened_product(x, w)
    assert tiled.shape == (2, 40, 1000)
    assert mx.allclose(tiled, whole, rtol=1e-5, atol=1e-4).item()

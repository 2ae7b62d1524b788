"""The CPU weight policy: what --weights auto / keep / float32 serve, and that
converted weights compute exactly what their float32 form does.

White-box: the native kernels' cached probe is reset between tests
(`native._reset_for_tests`), so each sees the environment it sets."""

from __future__ import annotations

import pytest

from mlxcel_trio.engine import weights

PROMPT = list(range(40, 72))
N = 16


@pytest.fixture(scope="module")
def four_bit():
    from fixtures.build import ensure
    return ensure("tiny-4bit")


@pytest.fixture(scope="module")
def bf16():
    from fixtures.build import ensure
    return ensure("tiny-bf16"), ensure("tiny-bf16-f32")


@pytest.fixture
def no_native(monkeypatch):
    """Today's float32 policy, as on a machine without the native kernels."""
    from mlxcel_trio.engine import native

    monkeypatch.setenv(native.ENV, "0")
    native._reset_for_tests()
    yield
    native._reset_for_tests()


def greedy(model) -> list[int]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    return [int(t) for t, _ in generate_step(mx.array(PROMPT), model, max_tokens=N,
                                             sampler=lambda x: mx.argmax(x, -1))]


def load(path, lazy=True):
    from mlx_lm.utils import load_model

    return load_model(path, lazy=lazy)[0]


def test_dequantized_4bit_equals_mlx_lms_own_dequantized_forward(four_bit):
    from mlx_lm.utils import dequantize_model

    ours, note = weights.apply(load(four_bit), "float32")
    assert note.startswith("weights converted from 4-bit to float32")
    assert weights.stored_form(ours) is None
    assert greedy(ours) == greedy(dequantize_model(load(four_bit, lazy=False)))


def test_upcast_bf16_equals_the_same_weights_stored_in_float32(bf16):
    import mlx.core as mx
    from mlx.utils import tree_flatten

    rounded, reference = bf16
    ours, note = weights.apply(load(rounded), "float32")
    assert note.startswith("weights converted from bfloat16 to float32")
    assert all(p.dtype == mx.float32 for _, p in tree_flatten(ours.parameters()))
    ref = load(reference, lazy=False)
    x = mx.array([PROMPT])
    assert mx.array_equal(ours(x), ref(x)).item()
    assert greedy(ours) == greedy(ref)


def test_keep_serves_the_weights_as_stored(four_bit, no_native):
    model, note = weights.apply(load(four_bit), "keep")
    assert weights.stored_form(model) == "4-bit"
    assert note == ("weights kept as 4-bit on MLX's own kernels; native kernels unavailable: "
                    "turned off by MLXCEL_NATIVE=0")


def test_auto_serves_the_native_kernels_when_they_measure_faster(four_bit, monkeypatch):
    from mlxcel_trio.engine import native

    if not native.available():
        pytest.skip(f"native kernels unavailable here: {native.status().detail}")
    monkeypatch.setattr(weights, "native_is_faster", lambda m: (True, "measured"))
    model, note = weights.apply(load(four_bit), "auto")
    assert weights.stored_form(model) == "4-bit"
    assert note.startswith("weights kept as 4-bit on the native CPU kernels") and "measured" in note
    monkeypatch.setattr(weights, "native_is_faster", lambda m: (False, "slower"))
    monkeypatch.setattr(weights, "float32_is_faster", lambda m: (True, "measured"))
    model, note = weights.apply(load(four_bit), "auto")
    assert weights.stored_form(model) is None
    assert "the native kernels are not faster here (slower)" in note


def test_auto_keeps_what_would_not_fit(four_bit, monkeypatch, no_native):
    monkeypatch.setattr(weights, "available_bytes", lambda: 64 << 20)  # 64 MiB free
    model, note = weights.apply(load(four_bit), "auto")
    assert weights.stored_form(model) == "4-bit"
    assert note.startswith("weights kept as 4-bit: float32 would need") and "--weights float32" in note


def test_auto_keeps_what_float32_does_not_speed_up(four_bit, monkeypatch, no_native):
    monkeypatch.setattr(weights, "float32_is_faster", lambda m: (False, "measured"))
    model, note = weights.apply(load(four_bit), "auto")
    assert weights.stored_form(model) == "4-bit" and "float32 is not faster here" in note


def test_auto_converts_when_faster_and_fitting(four_bit, monkeypatch, no_native):
    monkeypatch.setattr(weights, "float32_is_faster", lambda m: (True, "measured"))
    model, note = weights.apply(load(four_bit), "auto")
    assert weights.stored_form(model) is None and "float32 is faster on this CPU" in note


def test_float32_weights_need_no_decision(tiny_model):
    model, note = weights.apply(load(tiny_model), "auto")
    assert note is None and weights.stored_form(model) is None


def test_float32_size_counts_packed_values(four_bit, tiny_model):
    from mlx.utils import tree_flatten

    plain = sum(p.nbytes for _, p in tree_flatten(load(tiny_model).parameters()))
    assert weights.float32_bytes(load(four_bit)) == plain

"""RoPE overrides change the rotation for real (teacher-forced logits at long
positions, the model loaded once per arm), the checkpoint's own base is a
byte-identical control, and a family that ignores an override refuses."""

from __future__ import annotations

import json

import attrs
import numpy as np
import pytest

from mlxcel_trio.config import RopeOverrides
from mlxcel_trio.engine import rope

N_TOKENS = 1536   # long enough for low-frequency dimensions to matter


def _logits(path, overrides: RopeOverrides) -> np.ndarray:
    import mlx.core as mx

    model, _ = rope.load(path, overrides)
    rng = np.random.default_rng(0)
    tokens = mx.array(rng.integers(0, 1500, size=(1, N_TOKENS)))
    out = model(tokens)
    mx.eval(out)
    return np.array(out[0, -256:].astype(mx.float32))


@pytest.fixture(scope="module")
def reference(tiny_model):
    return _logits(tiny_model, RopeOverrides())


@pytest.fixture(scope="module")
def theta(tiny_model):
    return json.loads((tiny_model / "config.json").read_text())["rope_theta"]


def test_the_checkpoints_own_base_is_byte_identical(tiny_model, reference, theta):
    assert np.array_equal(_logits(tiny_model, RopeOverrides(freq_base=theta)), reference)


@pytest.mark.parametrize("overrides", [
    RopeOverrides(freq_base=10000.0),
    RopeOverrides(scale=4.0),                                  # bare scale: linear
    RopeOverrides(freq_scale=0.5),
    RopeOverrides(scaling="linear", scale=2.0),
    RopeOverrides(scaling="yarn", scale=4.0),
    RopeOverrides(scaling="yarn", scale=4.0, yarn_orig_ctx=256),
    RopeOverrides(scaling="yarn", scale=4.0, yarn_beta_fast=8.0, yarn_beta_slow=2.0),
], ids=repr)
def test_each_override_changes_the_logits(tiny_model, reference, overrides):
    moved = _logits(tiny_model, overrides)
    assert np.abs(moved - reference).max() > 1e-3


def test_yarn_knobs_change_a_yarn_rotation(tiny_model):
    base = _logits(tiny_model, RopeOverrides(scaling="yarn", scale=4.0))
    tuned = _logits(tiny_model, RopeOverrides(scaling="yarn", scale=4.0, yarn_orig_ctx=256))
    assert np.abs(tuned - base).max() > 1e-3


def test_the_extrapolation_mix_and_attention_factor_act_as_upstream(tiny_model):
    yarn = RopeOverrides(scaling="yarn", scale=4.0)
    full = _logits(tiny_model, yarn)
    half = _logits(tiny_model, attrs.evolve(yarn, yarn_ext_factor=0.5))
    none = _logits(tiny_model, attrs.evolve(yarn, yarn_ext_factor=0.0))
    linear = _logits(tiny_model, RopeOverrides(scaling="linear", scale=4.0))
    assert np.abs(half - full).max() > 1e-3 and np.abs(half - none).max() > 1e-3
    # a mix of 0 is full interpolation: linear scaling by the same factor
    # (a different MLX kernel path, so equal to rounding, not bitwise)
    assert np.abs(none - linear).max() < 1e-3 * max(1.0, np.abs(linear).max())
    # 1.0 is exactly mlx-lm's table
    assert np.array_equal(_logits(tiny_model, attrs.evolve(yarn, yarn_ext_factor=1.0)), full)
    # the attention factor counts only with a mix of 0, as upstream
    assert np.array_equal(_logits(tiny_model, attrs.evolve(yarn, yarn_attn_factor=2.0)), full)
    scaled = _logits(tiny_model, attrs.evolve(yarn, yarn_ext_factor=0.0, yarn_attn_factor=2.0))
    assert np.abs(scaled - none).max() > 1e-3


def test_yarn_knobs_alone_are_inert_on_a_plain_rotation(tiny_model, reference):
    o = RopeOverrides(yarn_orig_ctx=256, yarn_beta_fast=8.0)
    assert rope.patch(o, {"rope_theta": 1e6}) == {}
    assert np.array_equal(_logits(tiny_model, o), reference)


@pytest.fixture
def linear_checkpoint(tiny_model, tmp_path):
    """The tiny fixture declaring a linear block (weights linked, not copied)."""
    for f in tiny_model.iterdir():
        (tmp_path / f.name).symlink_to(f)
    cfg = json.loads((tiny_model / "config.json").read_text())
    cfg["rope_scaling"] = {"type": "linear", "factor": 4.0}
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_none_drops_the_checkpoints_block(linear_checkpoint, reference):
    declared = _logits(linear_checkpoint, RopeOverrides())
    assert np.abs(declared - reference).max() > 1e-3     # the block acts
    assert np.array_equal(_logits(linear_checkpoint, RopeOverrides(scaling="none")), reference)
    # linear without a scale keeps the checkpoint's own factor
    assert np.array_equal(_logits(linear_checkpoint, RopeOverrides(scaling="linear")),
                          declared)


def test_patch_arithmetic():
    cfg = {"max_position_embeddings": 32768,
           "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                            "original_max_position_embeddings": 8192}}
    # a bare scale replaces a YaRN block's factor, keeping its other keys
    assert rope.patch(RopeOverrides(freq_scale=0.125), cfg)["rope_scaling"] == {
        "type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192,
        "beta_fast": 32, "beta_slow": 1}
    # yarn on a plain checkpoint: original context from max_position_embeddings
    assert rope.patch(RopeOverrides(scaling="yarn"), {"max_position_embeddings": 4096}) == {
        "rope_scaling": {"type": "yarn", "factor": 1.0,
                         "original_max_position_embeddings": 4096,
                         "beta_fast": 32, "beta_slow": 1}}
    # a bare scale on a banded scheme is refused, naming the way out
    with pytest.raises(rope.RopeError, match="--rope-scaling linear"):
        rope.patch(RopeOverrides(scale=2.0), {"rope_scaling": {"rope_type": "llama3",
                                                                "factor": 8.0}})
    # transformers 5 nests the block under rope_parameters
    nested = {"rope_parameters": {"rope_theta": 1e6, "rope_type": "llama3", "factor": 8.0}}
    with pytest.raises(rope.RopeError, match="'llama3'"):
        rope.patch(RopeOverrides(scale=2.0), nested)
    # none forces freq scale 1 (a given scale is ignored, as upstream)
    assert rope.patch(RopeOverrides(scaling="none", scale=4.0), cfg) == {"rope_scaling": None}


def test_a_family_that_ignores_the_override_refuses(tiny_model, monkeypatch):
    """Simulate a family that builds its rotation inline: it never calls
    initialize_rope, so the applications check finds nothing honoured."""
    import mlx.nn as nn
    from mlx_lm.models import qwen3

    monkeypatch.setattr(qwen3, "initialize_rope",
                        lambda dims, base, traditional, *a, **k: nn.RoPE(dims, base=base))
    with pytest.raises(rope.RopeError, match="0 of 2 rotary modules honour it"):
        rope.load(tiny_model, RopeOverrides(freq_base=10000.0))

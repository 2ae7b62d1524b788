"""The Pixtral tower (engine/pixtral.py) on the tiny-pixtral fixture: the
forward run here matches mlx-vlm's own within its position table and goes
past it; a token budget is checked against the checkpoint before load."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from mlxcel_trio.protocol.records import ImageInput


def picture(w: int, h: int, seed: int = 0) -> ImageInput:
    rgb = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8).tobytes()
    return ImageInput(rgb, w, h, hashlib.sha256(rgb).hexdigest(), 0)


@pytest.fixture(scope="module")
def loaded(tiny_pixtral_model):
    import mlx.core as mx

    from mlxcel_trio.engine import vision

    config = json.loads((tiny_pixtral_model / "config.json").read_text())
    return config, vision.load_encoder(tiny_pixtral_model, config, mx.float32, (9, 9))


def test_the_forward_matches_mlx_vlms_and_each_image_its_grid(loaded, tiny_pixtral_model):
    import mlx.core as mx

    config, enc = loaded
    facts = json.loads((tiny_pixtral_model / "fixture_facts.json").read_text())
    assert (enc.info.image_token, enc.info.break_token, enc.info.end_token) == (
        facts["image_token"], facts["break_token"], facts["end_token"])
    x = mx.array(enc.pixels(picture(30, 24)))[None]          # 12 x 8 under 9 tokens
    *_, states = enc.tower(x, output_hidden_states=True)
    assert mx.allclose(enc.hidden(x), states[-1], atol=1e-5).item()
    # a sliver grown to the budget is 5 patches wide, past mlx-vlm's 4-per-side table
    (f,) = enc.encode([picture(4, 2)])
    assert f.shape == (15, config["text_config"]["hidden_size"])
    assert np.isfinite(np.asarray(f)).all()
    assert sum(t == enc.info.image_token for t in enc.info.layout(4, 2)) == 15


def test_a_budget_is_checked_against_the_checkpoint(tiny_pixtral_model, tiny_vlm_model,
                                                    tiny_model):
    from mlxcel_trio.engine.vision import budget_problem

    assert budget_problem(tiny_pixtral_model, "p", 9, 9) is None
    assert budget_problem(tiny_vlm_model, "v", -1, 0) is None
    assert budget_problem(tiny_pixtral_model, "p", 12, 6).startswith(
        "--image-min-tokens 12, --image-max-tokens 6: image_max_pixels (96) is less than "
        "image_min_pixels (192)")
    # one bound given: the other is upstream's Pixtral default (1024 tokens)
    assert "image_max_pixels (16384) is less than image_min_pixels (32000)" in budget_problem(
        tiny_pixtral_model, "p", 2000, -1)
    llava = budget_problem(tiny_vlm_model, "tiny-vlm", -1, 64)
    assert llava.startswith("--image-max-tokens 64: the checkpoint 'tiny-vlm' resizes every "
                            "image to one fixed geometry (llava)")
    assert "has no image tower" in budget_problem(tiny_model, "tiny", 4, -1)

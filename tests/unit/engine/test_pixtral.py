"""The Pixtral tower (engine/towers/pixtral.py) on the tiny-pixtral fixture: the
forward run here matches mlx-vlm's own within its position table and goes
past it; mistral3's 2 x 2 merge matches mlx-vlm's projector; a token
budget is checked against the checkpoint before load."""

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


def test_config_layouts_name_their_family():
    from mlxcel_trio.engine.towers.vlm_config import family, text_config

    pix = {"vision_config": {"model_type": "pixtral"}, "text_config": {"hidden_size": 8}}
    assert family({**pix, "model_type": "llava"}) == "pixtral"      # HF's pixtral-12b
    assert family({**pix, "model_type": "pixtral"}) == "pixtral"    # mlx-vlm's conversion
    assert family({**pix, "model_type": "mistral3"}) == "mistral3"
    assert text_config({**pix, "model_type": "pixtral"})["model_type"] == "mistral"
    clip = {"vision_config": {"model_type": "clip_vision_model"}, "text_config": {}}
    assert family({**clip, "model_type": "llava"}) == "llava"
    assert family({**clip, "model_type": "mistral3"}) is None
    assert family({"model_type": "llava"}) is None


def _mistral3_checkpoint(path):
    """A tower-only mistral3 snapshot (mlx-vlm's names), random weights."""
    from types import SimpleNamespace

    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.models.mistral3.mistral3 import Mistral3MultiModalProjector
    from mlx_vlm.models.pixtral.config import VisionConfig
    from mlx_vlm.models.pixtral.vision import VisionModel

    vision = dict(model_type="pixtral", hidden_size=32, intermediate_size=64, head_dim=16,
                  num_attention_heads=2, num_hidden_layers=2, image_size=32, patch_size=4,
                  num_channels=3, rope_theta=10000.0)
    config = {"model_type": "mistral3", "image_token_index": 10, "spatial_merge_size": 2,
              "vision_feature_layer": -1, "multimodal_projector_bias": False,
              "text_config": {"model_type": "mistral", "hidden_size": 48, "rms_norm_eps": 1e-5},
              "vision_config": vision}
    vcfg = VisionConfig.from_dict(vision)
    mx.random.seed(3)
    tower = VisionModel(vcfg)
    proj = Mistral3MultiModalProjector(SimpleNamespace(
        vision_config=vcfg, spatial_merge_size=2, vision_feature_layer=-1,
        multimodal_projector_bias=False,
        text_config=SimpleNamespace(hidden_size=48, rms_norm_eps=1e-5)))
    weights = {**{"vision_tower." + k: v for k, v in tree_flatten(tower.parameters())},
               **{"multi_modal_projector." + k: v for k, v in tree_flatten(proj.parameters())}}
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    (path / "config.json").write_text(json.dumps(config))
    (path / "preprocessor_config.json").write_text(json.dumps({"size": {"longest_edge": 32}}))
    (path / "tokenizer.json").write_text(json.dumps({"added_tokens": [
        {"id": 10, "content": "[IMG]"}, {"id": 12, "content": "[IMG_BREAK]"},
        {"id": 13, "content": "[IMG_END]"}]}))
    return config, tower, proj


def test_mistral3_merges_each_2x2_block_as_mlx_vlm_does(tmp_path):
    pytest.importorskip("mlx_vlm")
    import mlx.core as mx

    from mlxcel_trio.engine import vision

    config, tower, proj = _mistral3_checkpoint(tmp_path)
    enc = vision.load_encoder(tmp_path, config, mx.float32)
    # 30x24 fits the 32-pixel edge; sides round up to 8 (4-pixel patches, merged 2x2)
    assert enc.info.layout(30, 24) == (10,) * 4 + (12,) + (10,) * 4 + (12,) + (10,) * 4 + (13,)
    im = picture(30, 24)
    (mine,) = enc.encode([im])
    x = mx.array(enc.pixels(im))[None]
    *_, states = tower(x, output_hidden_states=True)
    ref = proj(states[-1][0], [(x.shape[1], x.shape[2])])
    assert mine.shape == ref.shape == (12, 48)
    assert mx.allclose(mine, ref, atol=1e-4).item()
    # the budget's patch area is (patch x merge)^2, as upstream's n_merge makes it
    assert vision.budget_problem(tmp_path, "m3", 4, 2).startswith(
        "--image-min-tokens 4, --image-max-tokens 2: image_max_pixels (128) is less than "
        "image_min_pixels (256)")


def test_the_worker_checks_each_run_against_its_images_size():
    from mlxcel_trio.engine.towers.base import ImageTower
    from mlxcel_trio.protocol.image_layout import ImageGeometry
    from mlxcel_trio.protocol.records import VisionInfo

    tower = ImageTower()
    tower.info = VisionInfo(image_token=7, family="pixtral", geometry=ImageGeometry(4, 16),
                            break_token=8, end_token=9)
    im = ImageInput(b"", 8, 8, "d", 1)                      # 2 x 2: 7 7 8 7 7 9
    assert tower.span(im) == 6
    assert tower.spans_ok([1, 7, 7, 8, 7, 7, 9, 2], [im])
    assert not tower.spans_ok([1, 7, 7, 7, 7, 7, 7, 2], [im])   # llava-style run
    assert not tower.spans_ok([1, 7, 7, 8, 7, 7], [im])         # cut short

"""engine/audio_chat.py and towers/gemma3n_audio.py against its references: the numpy log-mel front
end equals transformers' Gemma3nAudioFeatureExtractor, and the ids of the
audio range reach mlx-lm's per-layer inputs as mlx-vlm's Gemma 3n sends
them (as id 0)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mlxcel_trio.engine.audio_chat import flat_config, is_audio_chat
from mlxcel_trio.engine.towers.gemma3n_audio import MelFrontEnd


@pytest.fixture(scope="module")
def gemma3n():
    pytest.importorskip("mlx_vlm")
    from fixtures.build import ensure

    return ensure("tiny-gemma3n")


@pytest.mark.parametrize("seconds", [0.05, 1.3, 31.0])
def test_front_end_equals_the_reference_extractor(gemma3n, seconds):
    ref_mod = pytest.importorskip("transformers.models.gemma3n.feature_extraction_gemma3n")
    cfg = json.loads((gemma3n / "preprocessor_config.json").read_text())
    ref = ref_mod.Gemma3nAudioFeatureExtractor(**{k: v for k, v in cfg.items()
                                                  if k not in ("feature_extractor_type",
                                                               "processor_class")})
    rng = np.random.default_rng(7)
    wave = (0.2 * rng.standard_normal(int(16000 * seconds))).astype(np.float32)
    want = ref(wave, return_tensors="np")
    feats, pad = MelFrontEnd(cfg)(wave)
    np.testing.assert_allclose(feats, want["input_features"][0], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(~pad, want["input_features_mask"][0])


def test_audio_ids_reach_per_layer_inputs_as_id_zero(gemma3n):
    import mlx.core as mx
    from mlx_lm.utils import load_model

    config = json.loads((gemma3n / "config.json").read_text())
    assert is_audio_chat(config)
    assert flat_config(config)["max_position_embeddings"] == 4096
    model, _ = load_model(gemma3n)
    lm = model.model.language_model
    audio_ids = mx.array([[config["audio_token_id"], config["eoa_token_id"]]])
    zeros = mx.zeros_like(audio_ids)
    assert mx.array_equal(lm.get_per_layer_inputs(audio_ids), lm.get_per_layer_inputs(zeros))


def test_mlx_vlm_tensor_layout_loads_the_same_model(gemma3n, tmp_path):
    """mlx-vlm's own export names the tensors `language_model.model.*`,
    `audio_tower.*`, `embed_audio.*`: the same model and tower result."""
    import shutil
    from pathlib import Path

    import mlx.core as mx

    from mlxcel_trio.engine import rope
    from mlxcel_trio.engine.towers.gemma3n_audio import Gemma3nAudioTower

    for f in gemma3n.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, tmp_path / f.name)
    renamed = {}
    for k, v in mx.load(str(gemma3n / "model.safetensors")).items():
        if k.startswith("model.language_model."):
            k = "language_model.model." + k[len("model.language_model."):]
        elif k.startswith("model."):
            k = k[len("model."):]
        renamed[k] = v
    mx.save_safetensors(str(tmp_path / "model.safetensors"), renamed)
    ids = mx.array([[5, 6, 7, 8]])
    outs = []
    for path in (Path(gemma3n), tmp_path):
        model, config = rope.load(path, rope.RopeOverrides())
        outs.append(model(ids))
        encoder = Gemma3nAudioTower.load(path, config, mx.float32)
        assert encoder.embed_vision is not None
    assert mx.allclose(outs[0], outs[1]).item()

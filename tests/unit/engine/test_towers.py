"""engine/towers/: a new image family is one file plus one registry row.

The toy family (toy_tower.py beside this file) is added as one row of
towers/registry.py's IMAGE table; everything else (recognizing the
checkpoint, its text model's config, loading its tower, laying out and
checking its image runs, the pre-load budget check) follows from the row."""

from __future__ import annotations

import json

import pytest

from mlxcel_trio.engine import vision
from mlxcel_trio.engine.towers import registry
from mlxcel_trio.engine.towers.vlm_config import family, is_vlm, text_config
from mlxcel_trio.protocol.records import ImageInput

TOY = registry.ImageFamily("toy", "toyvlm", None, "tests.unit.engine.toy_tower:ToyTower",
                           text_type="qwen2")
CONFIG = {"model_type": "toyvlm", "image_token_index": 7,
          "text_config": {"hidden_size": 8}, "vision_config": {"model_type": "toyvit"}}


@pytest.fixture
def toy_row(monkeypatch):
    monkeypatch.setattr(registry, "IMAGE", (*registry.IMAGE, TOY))


def test_without_its_row_the_family_is_not_served():
    assert not is_vlm(CONFIG) and family(CONFIG) is None


def test_one_row_serves_a_new_family(toy_row, tmp_path):
    assert is_vlm(CONFIG) and family(CONFIG) == "toy"
    assert text_config(CONFIG)["model_type"] == "qwen2"   # the row's text default
    tower = vision.load_encoder(tmp_path, CONFIG, None)
    assert type(tower).__name__ == "ToyTower" and tower.info.tokens_per_image == 3
    image = ImageInput(b"", 4, 4, "d", 1)
    assert tower.span(image) == 3
    assert tower.spans_ok([1, 7, 7, 7, 2], [image])
    assert not tower.spans_ok([1, 7, 7, 2, 2], [image])
    (feats,) = tower.encode([image])
    assert feats.shape == (3, 8)
    # a fixed-geometry family has no token budget: refused before loading, by name
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    problem = vision.budget_problem(tmp_path, "toy", 16, -1)
    assert problem is not None and "--image-min-tokens 16" in problem


def test_every_row_names_a_tower_with_the_interface():
    for row in (*registry.IMAGE, *registry.AUDIO):
        cls = registry.tower_class(row)
        for name in ("load", "encode", "prefill", "span", "spans_ok", "text_dtype"):
            assert callable(getattr(cls, name, None)), (row.name, name)

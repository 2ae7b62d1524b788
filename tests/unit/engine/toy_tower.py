"""A fixture image family for test_towers.py: a tower that lays each image
out as three placeholder tokens and encodes it as zeros.  It exists to show
that a new family is this one file plus one registry row."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from mlxcel_trio.engine.towers.base import ImageTower
from mlxcel_trio.protocol.records import VisionInfo


class ToyTower(ImageTower):
    def __init__(self, info: VisionInfo, width: int) -> None:
        self.info = info
        self.width = width

    @classmethod
    def load(cls, path: Path, config: dict, dtype, budget=(0, 0)) -> "ToyTower":
        return cls(VisionInfo(image_token=int(config["image_token_index"]), tokens_per_image=3),
                   int(config["text_config"]["hidden_size"]))

    def encode(self, images):
        return [mx.zeros((self.info.tokens_per_image, self.width)) for _ in images]

"""The llava image tower: a CLIP tower, a two-layer MLP projector, one fixed
square geometry, one `<image>` placeholder token per image patch.

mlx-vlm (the optional media extra) supplies the tower and the projector; the
preprocessing (CLIPImageProcessor's steps) is done here from
preprocessor_config.json with PIL and numpy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import mlx.core as mx
import numpy as np

from ...protocol.records import ImageInput, VisionInfo
from .base import DEFAULT_RESAMPLE, ImageTower, install_tower, read_json
from .vlm_config import text_config


class Preprocess:
    """CLIPImageProcessor's steps, read from preprocessor_config.json:
    resize (shortest edge, or an exact size), center crop, rescale, normalize."""

    def __init__(self, cfg: dict, image_size: int) -> None:
        size = cfg.get("size") or {"shortest_edge": image_size}
        self.shortest = size.get("shortest_edge") if isinstance(size, dict) else int(size)
        self.exact = ((size["height"], size["width"])
                      if isinstance(size, dict) and "height" in size else None)
        crop = cfg.get("crop_size") or {"height": image_size, "width": image_size}
        if not isinstance(crop, dict):
            crop = {"height": int(crop), "width": int(crop)}
        self.crop = (int(crop["height"]), int(crop["width"])) if cfg.get(
            "do_center_crop", True) else None
        self.do_resize = cfg.get("do_resize", True)
        self.resample = int(cfg.get("resample", DEFAULT_RESAMPLE))
        self.scale = float(cfg.get("rescale_factor", 1 / 255)) if cfg.get("do_rescale", True) \
            else 1.0
        norm = cfg.get("do_normalize", True)
        self.mean = np.array(cfg.get("image_mean", [0.5] * 3) if norm else [0.0] * 3, np.float32)
        self.std = np.array(cfg.get("image_std", [0.5] * 3) if norm else [1.0] * 3, np.float32)
        self.final = self.crop or self.exact or (image_size, image_size)

    def __call__(self, image: ImageInput) -> np.ndarray:
        from PIL import Image

        img = Image.frombytes("RGB", (image.width, image.height), image.rgb)
        if self.do_resize:
            if self.exact is not None:
                h, w = self.exact
            else:
                short, long_ = sorted((img.width, img.height))
                s = int(self.shortest)
                other = max(1, int(s * long_ / short))
                w, h = (s, other) if img.width <= img.height else (other, s)
            img = img.resize((w, h), resample=self.resample)
        if self.crop is not None:
            ch, cw = self.crop
            left, top = (img.width - cw) // 2, (img.height - ch) // 2
            img = img.crop((left, top, left + cw, top + ch))
        x = np.asarray(img, dtype=np.float32) * self.scale
        return (x - self.mean) / self.std          # H, W, 3 (MLX's channels-last)


class LlavaTower(ImageTower):
    """A llava image tower + projector (mlx-vlm's modules) and the
    checkpoint's preprocessing."""

    def __init__(self, tower, projector, preprocess: Preprocess, *, layer, strategy: str,
                 info: VisionInfo, dtype) -> None:
        self.tower, self.projector = tower, projector
        self.preprocess = preprocess
        self.layer, self.strategy = layer, strategy
        self.info = info
        self.dtype = dtype

    @classmethod
    def load(cls, path: Path, config: dict, dtype,
             budget: tuple[int, int] = (0, 0)) -> "LlavaTower":
        """Build the tower and projector from the checkpoint's tensors, in the
        served float type `dtype` (the text model's, after the weight policy);
        the geometry is fixed, so `budget` (checked before loading) is unused."""
        from mlx_vlm.models.llava.config import ModelConfig, TextConfig, VisionConfig
        from mlx_vlm.models.llava.llava import LlavaMultiModalProjector
        from mlx_vlm.models.llava.vision import VisionModel

        vcfg = VisionConfig.from_dict(config["vision_config"])
        mcfg = ModelConfig(text_config=TextConfig.from_dict(text_config(config)),
                           vision_config=vcfg, model_type=config["model_type"])
        tower, projector = VisionModel(vcfg), LlavaMultiModalProjector(mcfg)
        install_tower(path, config, tower, projector, dtype)
        pre_cfg = read_json(path / "preprocessor_config.json")
        strategy = config.get("vision_feature_select_strategy", "default")
        # the tower's positions (a CLIP tower adds its class token), less the
        # first one under the "default" feature strategy, as transformers drops it
        n = tower.vision_model.embeddings.num_positions - (1 if strategy == "default" else 0)
        info = VisionInfo(image_token=int(config.get("image_token_index", 32000)),
                          tokens_per_image=n)
        return cls(tower, projector, Preprocess(pre_cfg, vcfg.image_size),
                   layer=config.get("vision_feature_layer", -2), strategy=strategy,
                   info=info, dtype=dtype)

    def encode(self, images: Sequence[ImageInput]) -> list[mx.array]:
        """Each image's features, [tokens_per_image, text width]."""
        x = mx.array(np.stack([self.preprocess(im) for im in images]))
        *_, hidden = self.tower(x.astype(self._float()), output_hidden_states=True)
        layers = self.layer if isinstance(self.layer, list) else [self.layer]
        picked = [hidden[i][:, 1:] if self.strategy == "default" else hidden[i] for i in layers]
        return list(self.projector(mx.concatenate(picked, axis=-1)))

    def _float(self):
        return self.tower.vision_model.embeddings.position_embedding.weight.dtype

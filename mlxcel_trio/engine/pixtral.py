"""Pixtral's image tower: each image encoded at its own resolution.

mlx-vlm's pixtral modules supply the layers (patch convolution, RMSNorm,
the transformer blocks) and the two-layer projector; the forward pass is
run here so that the tower's 2-D rotary positions are computed for the
image's own grid rather than read from mlx-vlm's table, which stops at
vision_config.image_size per side and which a token budget's resize may
exceed (an image scaled up to --image-min-tokens, a long thin one scaled
into --image-max-tokens).  One image per forward, so no block mask is
needed between images.

The tensors are read as HF's layout names them (`vision_tower.transformer.*`,
`vision_tower.patch_conv.*`) or as mlx-vlm converts them
(`vision_tower.vision_model.*`).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

import mlx.core as mx
import numpy as np

from ..protocol.image_layout import ImageGeometry, budget_pixels, resized
from ..protocol.records import ImageInput, VisionInfo
from .vision import _PIXTRAL_TOKENS, _DEFAULT_RESAMPLE, install_tower, read_json, text_config

_DEFAULT_IMAGE_TOKEN = 10  # pixtral-12b's [IMG]


def geometry(path: Path, config: dict, budget: tuple[int, int] = (0, 0)) -> ImageGeometry:
    """The checkpoint's resize rule (pure JSON): the tower's patch size, the
    preprocessor's longest edge, and a token budget's pixel bounds."""
    vcfg = config["vision_config"]
    unit = int(vcfg.get("patch_size", 16))
    size = read_json(path / "preprocessor_config.json").get("size") or {}
    if isinstance(size, dict):
        edge = size.get("longest_edge") or max(size.get("height", 0), size.get("width", 0))
    else:
        edge = int(size)
    edge = int(edge or vcfg.get("image_size", 1024))
    if budget[0] > 0 or budget[1] > 0:
        lo, hi = budget_pixels(unit, *budget)
        return ImageGeometry(unit, edge, lo, hi)
    return ImageGeometry(unit, edge)


def token_ids(path: Path, config: dict) -> tuple[int, int, int]:
    """[IMG], [IMG_BREAK], [IMG_END] ids: the placeholder from config.json,
    the other two looked up by name (processor_config.json's, else HF's)
    among the tokenizer's added tokens."""
    proc = read_json(path / "processor_config.json")
    names = {k: proc.get(k) or v for k, v in _PIXTRAL_TOKENS.items()}
    added: dict[str, int] = {}
    for tok in read_json(path / "tokenizer.json").get("added_tokens", []):
        added[tok.get("content")] = int(tok.get("id"))
    for tid, tok in read_json(path / "tokenizer_config.json").get(
            "added_tokens_decoder", {}).items():
        added.setdefault(tok.get("content"), int(tid))
    image = config.get("image_token_index", config.get("image_token_id"))
    if image is None:
        image = added.get(names["image_token"], _DEFAULT_IMAGE_TOKEN)
    missing = [names[k] for k in ("image_break_token", "image_end_token") if names[k] not in added]
    if missing:
        raise ValueError(f"this Pixtral checkpoint's tokenizer has no {' or '.join(missing)} "
                         "token to lay an image's rows out with")
    return int(image), added[names["image_break_token"]], added[names["image_end_token"]]


def _vision_model_key(key: str) -> str:
    """HF's tower names (`transformer.*`, `patch_conv.*`, `ln_pre.*`) under
    mlx-vlm's `vision_model.` module."""
    return key if key.startswith("vision_model.") else "vision_model." + key


class PixtralEncoder:
    """A Pixtral tower + projector and the checkpoint's preprocessing at
    each image's own size."""

    def __init__(self, tower, projector, info: VisionInfo, pre: dict, layer: int) -> None:
        self.tower, self.projector = tower, projector
        self.info = info
        self.layer = layer
        self.resample = int(pre.get("resample", _DEFAULT_RESAMPLE))
        self.scale = float(pre.get("rescale_factor", 1 / 255)) if pre.get("do_rescale", True) \
            else 1.0
        norm = pre.get("do_normalize", True)
        self.mean = np.array(pre.get("image_mean", [0.48145466, 0.4578275, 0.40821073])
                             if norm else [0.0] * 3, np.float32)
        self.std = np.array(pre.get("image_std", [0.26862954, 0.26130258, 0.27577711])
                            if norm else [1.0] * 3, np.float32)

    @classmethod
    def load(cls, path: Path, config: dict, dtype,
             budget: tuple[int, int] = (0, 0)) -> "PixtralEncoder":
        from mlx_vlm.models.pixtral.config import VisionConfig
        from mlx_vlm.models.pixtral.pixtral import LlavaMultiModalProjector
        from mlx_vlm.models.pixtral.vision import VisionModel

        vcfg = VisionConfig.from_dict({**config["vision_config"], "model_type": "pixtral"})
        text = SimpleNamespace(hidden_size=int(text_config(config)["hidden_size"]))
        tower = VisionModel(vcfg)
        projector = LlavaMultiModalProjector(SimpleNamespace(vision_config=vcfg, text_config=text))
        install_tower(path, config, tower, projector, dtype, rename=_vision_model_key)
        image, brk, end = token_ids(path, config)
        info = VisionInfo(image_token=image, family="pixtral",
                          geometry=geometry(path, config, budget), break_token=brk,
                          end_token=end)
        layer = config.get("vision_feature_layer", -1)
        return cls(tower, projector, info, read_json(path / "preprocessor_config.json"),
                   layer if isinstance(layer, int) else layer[-1])

    def pixels(self, image: ImageInput) -> np.ndarray:
        """The image at its grid's size, rescaled and normalized: H, W, 3."""
        from PIL import Image

        img = Image.frombytes("RGB", (image.width, image.height), image.rgb)
        size = resized(self.info.geometry, image.width, image.height)
        if size != img.size:
            img = img.resize(size, resample=self.resample)
        x = np.asarray(img, dtype=np.float32) * self.scale
        return (x - self.mean) / self.std

    def encode(self, images: Sequence[ImageInput]) -> list[mx.array]:
        """Each image's features, [rows * cols, text width], row-major."""
        return [self.projector(self.hidden(mx.array(self.pixels(im))[None]))[0]
                for im in images]

    def hidden(self, x: mx.array) -> mx.array:
        """The tower's hidden state at the feature layer for one image
        [1, H, W, 3]: [1, rows * cols, width]."""
        vm = self.tower.vision_model
        patches = vm.patch_conv(x.astype(vm.patch_conv.weight.dtype))
        _, rows, cols, width = patches.shape
        h = vm.ln_pre(patches.reshape(1, rows * cols, width))
        pos = _rope_2d(vm.config, rows, cols, h.dtype)
        states = [h]
        for layer in vm.transformer.layers:
            h = layer(h, position_embeddings=pos)
            states.append(h)
        return states[self.layer]


def _rope_2d(cfg, rows: int, cols: int, dtype) -> tuple[mx.array, mx.array]:
    """cos/sin of Pixtral's 2-D rotary angles for a rows x cols grid, in
    row-major order: half the frequencies turn with the row, half with the
    column (as mlx-vlm's PixtralRotaryEmbedding, without its size cap)."""
    dim = cfg.head_dim
    freqs = 1.0 / (cfg.rope_theta ** (mx.arange(0, dim, 2).astype(mx.float32) / dim))
    fh = mx.outer(mx.arange(rows), freqs[::2]).astype(mx.float32)
    fw = mx.outer(mx.arange(cols), freqs[1::2]).astype(mx.float32)
    inv = mx.concatenate([mx.broadcast_to(fh[:, None, :], (rows, cols, fh.shape[1])),
                          mx.broadcast_to(fw[None, :, :], (rows, cols, fw.shape[1]))],
                         axis=-1).reshape(rows * cols, -1)
    emb = mx.concatenate([inv, inv], axis=-1)
    return mx.cos(emb).astype(dtype), mx.sin(emb).astype(dtype)

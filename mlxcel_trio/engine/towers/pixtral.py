"""Pixtral's image tower (Pixtral, Mistral 3): each image encoded at its own
resolution.

mlx-vlm's pixtral modules supply the layers (patch convolution, RMSNorm,
the transformer blocks) and the two-layer projector (mistral3's: RMSNorm,
a learned merge of each 2 x 2 block of patches, then the two layers, so one
token covers `spatial_merge_size` patches a side); the forward pass is
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

from ...protocol.image_layout import ImageGeometry, budget_pixels, resized
from ...protocol.records import ImageInput, VisionInfo
from .base import DEFAULT_RESAMPLE, ImageTower, install_tower, read_json
from .vlm_config import family, text_config

_DEFAULT_IMAGE_TOKEN = 10  # pixtral-12b's [IMG]
# HF PixtralProcessor's token names (processor_config.json may rename them)
TOKEN_NAMES = {"image_token": "[IMG]", "image_break_token": "[IMG_BREAK]",
               "image_end_token": "[IMG_END]"}


def merge_size(config: dict) -> int:
    """Patches merged per token side: mistral3's spatial_merge_size (2 by
    default), 1 for Pixtral."""
    return int(config.get("spatial_merge_size", 2)) if config.get("model_type") == "mistral3" \
        else 1


def geometry(path: Path, config: dict, budget: tuple[int, int] = (0, 0)) -> ImageGeometry:
    """The checkpoint's resize rule (pure JSON): the tower's patch size times
    the merge (one token's side, as HF's processor aligns to), the
    preprocessor's longest edge, and a token budget's pixel bounds."""
    vcfg = config["vision_config"]
    unit = int(vcfg.get("patch_size", 16)) * merge_size(config)
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
    names = {k: proc.get(k) or v for k, v in TOKEN_NAMES.items()}
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


class PixtralTower(ImageTower):
    """A Pixtral tower + projector and the checkpoint's preprocessing at
    each image's own size."""

    geometry = staticmethod(geometry)  # the resize rule, for the pre-load budget check

    def __init__(self, tower, projector, info: VisionInfo, pre: dict, layer: int,
                 merge: int = 1) -> None:
        self.tower, self.projector = tower, projector
        self.info = info
        self.layer = layer
        self.merge = merge
        self.patch = tower.vision_model.patch_size
        self.resample = int(pre.get("resample", DEFAULT_RESAMPLE))
        self.scale = float(pre.get("rescale_factor", 1 / 255)) if pre.get("do_rescale", True) \
            else 1.0
        norm = pre.get("do_normalize", True)
        self.mean = np.array(pre.get("image_mean", [0.48145466, 0.4578275, 0.40821073])
                             if norm else [0.0] * 3, np.float32)
        self.std = np.array(pre.get("image_std", [0.26862954, 0.26130258, 0.27577711])
                            if norm else [1.0] * 3, np.float32)

    @classmethod
    def load(cls, path: Path, config: dict, dtype,
             budget: tuple[int, int] = (0, 0)) -> "PixtralTower":
        from mlx_vlm.models.pixtral.config import VisionConfig
        from mlx_vlm.models.pixtral.vision import VisionModel

        vcfg = VisionConfig.from_dict({**config["vision_config"], "model_type": "pixtral"})
        tcfg = text_config(config)
        text = SimpleNamespace(hidden_size=int(tcfg["hidden_size"]),
                               rms_norm_eps=float(tcfg.get("rms_norm_eps", 1e-5)))
        layer = config.get("vision_feature_layer", -1)
        layer = layer if isinstance(layer, int) else layer[-1]
        merge = merge_size(config)
        tower = VisionModel(vcfg)
        if config.get("model_type") == "mistral3":
            from mlx_vlm.models.mistral3.mistral3 import Mistral3MultiModalProjector

            projector = Mistral3MultiModalProjector(SimpleNamespace(
                vision_config=vcfg, text_config=text, spatial_merge_size=merge,
                vision_feature_layer=layer,
                multimodal_projector_bias=config.get("multimodal_projector_bias", False)))
        else:
            from mlx_vlm.models.pixtral.pixtral import LlavaMultiModalProjector

            projector = LlavaMultiModalProjector(SimpleNamespace(vision_config=vcfg,
                                                                 text_config=text))
        install_tower(path, config, tower, projector, dtype, rename=_vision_model_key)
        image, brk, end = token_ids(path, config)
        info = VisionInfo(image_token=image, family=family(config),
                          geometry=geometry(path, config, budget), break_token=brk,
                          end_token=end)
        return cls(tower, projector, info, read_json(path / "preprocessor_config.json"),
                   layer, merge)

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
        out = []
        for im in images:
            x = mx.array(self.pixels(im))[None]
            out.append(self.project(self.hidden(x), x.shape[1] // self.patch,
                                    x.shape[2] // self.patch))
        return out

    def project(self, h: mx.array, rows: int, cols: int) -> mx.array:
        """The tower's [1, rows * cols, width] patches in the text's width,
        each merge x merge block of patches one row (mistral3's merge, as
        torch's unfold orders a block: channel, then row, then column)."""
        if self.merge == 1:
            return self.projector(h)[0]
        p, m = self.projector, self.merge
        x = p.norm(h[0])
        d = x.shape[-1]
        x = x.reshape(rows // m, m, cols // m, m, d).transpose(0, 2, 4, 1, 3)
        x = p.patch_merger.merging_layer(x.reshape(-1, d * m * m))
        return p.linear_2(p.gelu(p.linear_1(x)))

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

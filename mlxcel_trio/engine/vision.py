"""Integrated vision-language checkpoints: the image tower beside mlx-lm's
text model.

An MLX VLM checkpoint (mlx-vlm's layout, as mlx-community publishes them)
holds the language model under `language_model.*` and the image tower and
projector under `vision_tower.*` / `multi_modal_projector.*`, in one
SafeTensors snapshot with a config.json carrying `text_config` and
`vision_config`.  The language model is built by mlx-lm from `text_config`
(`model_classes` below), so continuous batching, the prompt cache, LoRA and
speculative decoding run on it unchanged.  mlx-vlm (an optional extra)
supplies only the image tower and the projector; the image preprocessing
is done here from preprocessor_config.json with PIL and numpy.

Families served, over any text model mlx-lm builds (llama, mistral,
qwen2, ...):

- `llava`: a CLIP tower, a two-layer MLP projector, a fixed square
  geometry, one `<image>` placeholder token per image patch;
- `pixtral` (config.json's model_type "llava" with a vision_config of
  model_type "pixtral", as HF ships pixtral-12b, or "pixtral" as mlx-vlm
  converts it): Mistral's 2-D RoPE tower at the image's own resolution;
- `mistral3` (Mistral Small 3.1 and kin): the same tower, its patches
  merged 2 x 2 (`spatial_merge_size`) by the projector before the text.

On the last two (engine/pixtral.py) each image takes a grid of `[IMG]`
tokens, rows ended by `[IMG_BREAK]` and the last by `[IMG_END]`
(protocol/image_layout.py, where the size rule lives: the checkpoint's
longest edge, or upstream's pixel bounds under --image-min-tokens /
--image-max-tokens).

A request's image is encoded once, on the engine thread, when its job is
admitted; its features replace the placeholder positions' token
embeddings while the prompt is prefilled into a fresh cache (`prefill`),
and the sequence then decodes in the shared batch like any other.
"""

from __future__ import annotations

import glob
import json
import logging
from pathlib import Path
from typing import Any, Sequence

import mlx.core as mx
import numpy as np

from ..protocol.image_layout import PIXTRAL_MAX_TOKENS, PIXTRAL_MIN_TOKENS
from ..protocol.records import ImageInput, VisionInfo
from .lora import split_rows

log = logging.getLogger("mlxcel.engine")

FAMILIES = ("llava", "pixtral", "mistral3")
# the families whose images take a grid that follows their size (engine/pixtral.py)
DYNAMIC = ("pixtral", "mistral3")
_TEXT = "language_model."
_TOWER = ("vision_tower.", "multi_modal_projector.")
# PIL's resampling codes as preprocessor_config.json spells them (HF's PILImageResampling)
_DEFAULT_RESAMPLE = 3  # bicubic
# HF PixtralProcessor's token names (processor_config.json may rename them)
_PIXTRAL_TOKENS = {"image_token": "[IMG]", "image_break_token": "[IMG_BREAK]",
                   "image_end_token": "[IMG_END]"}


def family(config: dict) -> str | None:
    """The image family of a config.json, or None (not a VLM served here)."""
    if not (isinstance(config.get("text_config"), dict)
            and isinstance(config.get("vision_config"), dict)):
        return None
    kind = config.get("model_type")
    if kind in FAMILIES and config["vision_config"].get("model_type") == "pixtral":
        return "mistral3" if kind == "mistral3" else "pixtral"
    return "llava" if kind == "llava" else None


def is_vlm(config: dict) -> bool:
    """An integrated VLM of a family served here (decided from config.json)."""
    return family(config) is not None


def text_config(config: dict) -> dict:
    """The language model's own config: `text_config`, with the top-level
    fields a VLM config keeps there (vocab size, EOS, quantization)."""
    text = dict(config["text_config"])
    for key in ("vocab_size", "eos_token_id", "quantization", "quantization_config"):
        if key in config and key not in text:
            text[key] = config[key]
    text.setdefault("model_type", "mistral" if family(config) in DYNAMIC else "llama")
    # transformers' llava configs list only what differs from the text
    # family's defaults (llava-1.5's is six keys): fill in LlamaConfig's
    if text["model_type"] == "llama":
        text = {**_LLAMA_DEFAULTS, **text}
    # the text families llava wraps (llama, mistral, qwen2) default to an
    # untied head; mlx-lm's llama would otherwise drop lm_head and tie it
    text.setdefault("tie_word_embeddings", False)
    return text


_LLAMA_DEFAULTS = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                       num_attention_heads=32, rms_norm_eps=1e-6, rope_theta=10000.0,
                       max_position_embeddings=2048, vocab_size=32000)


def flat_config(config: dict) -> dict:
    """config.json as the loader's summary reads it: the text model's sizes
    (context, width, vocabulary) at the top, the VLM's model_type kept."""
    if not is_vlm(config):
        return config
    return {**text_config(config), **{k: v for k, v in config.items()
                                      if k not in ("text_config", "vision_config")}}


def text_problem(config: dict) -> str | None:
    """Why mlx-lm cannot build this VLM's language model, or None."""
    import importlib.util

    from .architectures import _resolved_type

    kind = _resolved_type(text_config(config))
    if importlib.util.find_spec(f"mlx_lm.models.{kind}") is None:
        return (f"'{config['model_type']}' checkpoint: its language model "
                f"'{text_config(config)['model_type']}' is not an architecture mlx-lm builds")
    if importlib.util.find_spec("mlx_vlm") is None:
        return ("this checkpoint has an image tower, which needs the optional 'media' extra "
                "(pip install 'mlxcel-trio[media]')")
    return None


def model_classes(config: dict):
    """mlx-lm's `get_model_classes` hook: a VLM's language model is mlx-lm's
    class for `text_config`, reading only the `language_model.*` tensors."""
    from mlx_lm.utils import _get_classes

    if not is_vlm(config):
        return _get_classes(config)
    base_model, base_args = _get_classes(text_config(config))

    class LanguageModel(base_model):
        def sanitize(self, weights: dict) -> dict:
            own = {k[len(_TEXT):]: v for k, v in weights.items() if k.startswith(_TEXT)}
            sanitize = getattr(super(), "sanitize", None)
            return sanitize(own) if sanitize else own

    class Args:
        @staticmethod
        def from_dict(params: dict):
            return base_args.from_dict(text_config(params))

    LanguageModel.__name__ = base_model.__name__
    return LanguageModel, Args


# -- preprocessing ---------------------------------------------------------------

class _Preprocess:
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
        self.resample = int(cfg.get("resample", _DEFAULT_RESAMPLE))
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


# -- the tower --------------------------------------------------------------------

class VisionEncoder:
    """A llava image tower + projector (mlx-vlm's modules) and the
    checkpoint's preprocessing."""

    def __init__(self, tower, projector, preprocess: _Preprocess, *, layer, strategy: str,
                 info: VisionInfo, dtype) -> None:
        self.tower, self.projector = tower, projector
        self.preprocess = preprocess
        self.layer, self.strategy = layer, strategy
        self.info = info
        self.dtype = dtype

    @classmethod
    def load(cls, path: Path, config: dict, dtype) -> "VisionEncoder":
        """Build the tower and projector from the checkpoint's tensors, in the
        served float type `dtype` (the text model's, after the weight policy)."""
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
        return cls(tower, projector, _Preprocess(pre_cfg, vcfg.image_size),
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


def load_encoder(path: Path, config: dict, dtype, budget: tuple[int, int] = (0, 0)):
    """The image encoder of the checkpoint's family (`budget`: the token
    bounds of --image-min-tokens / --image-max-tokens, 0 = the model's)."""
    if family(config) in DYNAMIC:
        from .pixtral import PixtralEncoder

        return PixtralEncoder.load(path, config, dtype, budget)
    return VisionEncoder.load(path, config, dtype)


def read_json(path: Path) -> dict:
    """A checkpoint's JSON side file, {} when it is absent."""
    return json.loads(path.read_text()) if path.exists() else {}


def install_tower(path: Path, config: dict, tower, projector, dtype, rename=None) -> None:
    """Load `vision_tower.*` / `multi_modal_projector.*` from the snapshot into
    the modules (`rename`: a family's key fix-up, applied after the prefix is
    dropped), quantized as stored, then cast to the served float `dtype`."""
    weights: dict[str, mx.array] = {}
    for f in sorted(glob.glob(str(path / "model*.safetensors"))):
        weights.update({k: v for k, v in mx.load(f).items() if k.startswith(_TOWER)})
    tower_w = {k[len(_TOWER[0]):]: v for k, v in weights.items() if k.startswith(_TOWER[0])}
    if rename is not None:
        tower_w = {rename(k): v for k, v in tower_w.items()}
    tower_w = tower.sanitize(tower_w)
    proj_w = {k[len(_TOWER[1]):]: v for k, v in weights.items() if k.startswith(_TOWER[1])}
    load_parts(((tower, tower_w), (projector, proj_w)), config.get("quantization"), dtype)


def load_parts(parts, quant: dict | None, dtype) -> None:
    """Load each (module, tensors) pair strictly, quantized where the
    stored tensors are, then cast to the served float `dtype` (None: as
    stored)."""
    from mlx import nn

    for module, w in parts:
        if quant and any(k.endswith(".scales") for k in w):
            nn.quantize(module, group_size=quant["group_size"], bits=quant["bits"],
                        class_predicate=lambda p, m, w=w: f"{p}.scales" in w)
        module.load_weights(list(w.items()), strict=True)
        module.eval()
        if dtype is not None:
            module.update(_cast(module.parameters(), dtype))
    mx.eval([module.parameters() for module, _ in parts])


def _cast(tree: Any, dtype) -> Any:
    if isinstance(tree, dict):
        return {k: _cast(v, dtype) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_cast(v, dtype) for v in tree]
    if isinstance(tree, mx.array) and mx.issubdtype(tree.dtype, mx.floating):
        return tree.astype(dtype)
    return tree


def embed_tokens(model) -> Any:
    """The text model's token embedding (mlx-lm's `model.model.embed_tokens`)."""
    inner = getattr(model, "model", None)
    layer = getattr(inner, "embed_tokens", None)
    if layer is None:
        raise ValueError("this language model exposes no token embedding to place images in")
    return layer


def prefill(model, encoder, prompt: Sequence[int],
            images: Sequence[ImageInput], caches: list, step: int) -> int:
    """Run `prompt` but its last token through `model` into `caches`, each
    image's features in place of its placeholder embeddings (a break or end
    token in its run keeps its own embedding); returns the number of tokens
    the caches now hold.  The last token is left for the batch generator,
    whose first forward samples the first output token.  (A prompt that
    ends on an image therefore sees its last position as the token's own
    embedding: a raw prompt ending on the media marker is the only way to
    get one; rendered chats end on text.)"""
    n = len(prompt) - 1
    feats = encoder.encode(images)
    ids = mx.array(list(prompt[:n]))
    h = embed_tokens(model)(ids)
    info = encoder.info
    for im, f in zip(images, feats):
        run = info.layout(im.width, im.height)
        at = [im.start + i for i, t in enumerate(run) if t == info.image_token]
        k = sum(1 for p in at if p < n)
        if k:
            h[mx.array(at[:k])] = f[:k].astype(h.dtype)
    return prefill_embeddings(model, ids, h, caches, step)


def prefill_embeddings(model, ids: mx.array, h: mx.array, caches: list, step: int) -> int:
    """Run `ids` with input embeddings `h` through `model` into `caches`,
    `step` tokens a forward; returns how many tokens the caches now hold."""
    n = len(ids)
    for s in range(0, n, max(1, step)):
        e = min(n, s + step)
        model(ids[None, s:e], cache=caches, input_embeddings=h[None, s:e])
        mx.eval([c.state for c in split_rows(caches)[0]])
    return n


def image_span(info: VisionInfo, image: ImageInput) -> int:
    """How many prompt positions the image's run takes."""
    return len(info.layout(image.width, image.height))


def spans_ok(prompt: Sequence[int], images: Sequence[ImageInput], info: VisionInfo) -> bool:
    """Every image's run lies inside the prompt, in order, exactly as its
    size lays it out (a job built by the server always is)."""
    end = 0
    for im in images:
        run = info.layout(im.width, im.height)
        if im.start < end or im.start + len(run) > len(prompt):
            return False
        end = im.start + len(run)
        if tuple(prompt[im.start:end]) != run:
            return False
    return True


def budget_problem(path: str | Path, name: str, min_tokens: int, max_tokens: int) -> str | None:
    """Why --image-min-tokens / --image-max-tokens cannot be honored on the
    checkpoint at `path` (from its JSON files alone, before any weight is
    read), or None.  Only a positive value is a budget, as upstream's."""
    if min_tokens <= 0 and max_tokens <= 0:
        return None
    flags = [f"--image-{w}-tokens {v}" for w, v in (("min", min_tokens), ("max", max_tokens))
             if v > 0]
    given = ", ".join(flags)
    try:
        config = read_json(Path(path) / "config.json")
    except (OSError, ValueError):
        return None  # the architecture check names what is wrong with the file
    kind = family(config)
    if kind not in DYNAMIC:
        what = ("resizes every image to one fixed geometry (llava), so there is no token "
                "budget to move" if kind else "has no image tower")
        return (f"{given}: the checkpoint '{name}' {what}; drop "
                f"{' and '.join(f.split()[0] for f in flags)}, or serve a dynamic-resolution "
                "vision checkpoint (Pixtral, Mistral 3)")
    from .pixtral import geometry

    g = geometry(Path(path), config, (min_tokens, max_tokens))
    if g.max_pixels < g.min_pixels:
        return (f"{given}: image_max_pixels ({g.max_pixels}) is less than image_min_pixels "
                f"({g.min_pixels}); give --image-max-tokens at least --image-min-tokens "
                f"(unset, they are {PIXTRAL_MIN_TOKENS} and {PIXTRAL_MAX_TOKENS})")
    return None

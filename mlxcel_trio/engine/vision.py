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

Each family is one tower in engine/towers/ (llava.py, pixtral.py), found
through towers/registry.py's IMAGE rows; this module holds what is common
to an integrated VLM: the text model's loading hook, the pre-load checks and
building the checkpoint's tower.

On the last two (towers/pixtral.py) each image takes a grid of `[IMG]`
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

from pathlib import Path

from ..protocol.image_layout import PIXTRAL_MAX_TOKENS, PIXTRAL_MIN_TOKENS
from .towers.base import TEXT_PREFIX, read_json
from .towers.registry import image_family, tower_class
from .towers.vlm_config import dynamic, family, is_vlm, text_config


def text_problem(config: dict) -> str | None:
    """Why mlx-lm cannot build this VLM's language model, or None."""
    import importlib.util

    from .mlx_lm_internals import resolved_type

    kind = resolved_type(text_config(config))
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
    from .mlx_lm_internals import get_classes as _get_classes

    if not is_vlm(config):
        return _get_classes(config)
    base_model, base_args = _get_classes(text_config(config))

    class LanguageModel(base_model):
        def sanitize(self, weights: dict) -> dict:
            own = {k[len(TEXT_PREFIX):]: v for k, v in weights.items()
                   if k.startswith(TEXT_PREFIX)}
            sanitize = getattr(super(), "sanitize", None)
            return sanitize(own) if sanitize else own

    class Args:
        @staticmethod
        def from_dict(params: dict):
            return base_args.from_dict(text_config(params))

    LanguageModel.__name__ = base_model.__name__
    return LanguageModel, Args


def load_encoder(path: Path, config: dict, dtype, budget: tuple[int, int] = (0, 0)):
    """The image tower of the checkpoint's family (`budget`: the token
    bounds of --image-min-tokens / --image-max-tokens, 0 = the model's)."""
    return tower_class(image_family(config)).load(path, config, dtype, budget)


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
    if not dynamic(config):
        what = (f"resizes every image to one fixed geometry ({kind}), so there is no token "
                "budget to move" if kind else "has no image tower")
        return (f"{given}: the checkpoint '{name}' {what}; drop "
                f"{' and '.join(f.split()[0] for f in flags)}, or serve a dynamic-resolution "
                "vision checkpoint (Pixtral, Mistral 3)")
    g = tower_class(image_family(config)).geometry(Path(path), config, (min_tokens, max_tokens))
    if g.max_pixels < g.min_pixels:
        return (f"{given}: image_max_pixels ({g.max_pixels}) is less than image_min_pixels "
                f"({g.min_pixels}); give --image-max-tokens at least --image-min-tokens "
                f"(unset, they are {PIXTRAL_MIN_TOKENS} and {PIXTRAL_MAX_TOKENS})")
    return None

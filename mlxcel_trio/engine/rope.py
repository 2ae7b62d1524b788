"""RoPE overrides: --rope-scaling / --rope-scale / --rope-freq-scale /
--rope-freq-base / --yarn-*, applied to the checkpoint's config before the
model is constructed (where llama_model_load applies them upstream).

Theory of operation.  mlx-lm models build their rotary embedding from the
config's `rope_theta` and `rope_scaling` block through
`mlx_lm.models.rope_utils.initialize_rope`.  `patch` turns the overrides
into new values for those two keys, with upstream's sentinels (0 / negative
= the checkpoint's own).  `load` constructs the model with them while
counting: every `initialize_rope` call made during construction is wrapped,
and afterwards every rotary module in the model must be one that such a call
built from the overridden values.  A family that computes its rotation
inline (or ignores the block) therefore refuses to serve instead of silently
serving the checkpoint's rotation; no list of families is kept.

Upstream mapping (llama-context.cpp):
- freq scale = --rope-freq-scale, or 1 / --rope-scale; factor = 1 / scale.
- none: the block is dropped (upstream forces freq_scale 1).
- linear: factor from the flags, else the checkpoint block's, else 1.
- yarn: factor likewise; original context from --yarn-orig-ctx, else the
  block's original_max_position_embeddings, else max_position_embeddings,
  else 4096; betas from the flags, else the block's, else 32 / 1.
- no --rope-scaling: the checkpoint's own scheme; a bare scale makes a
  plain checkpoint linear and replaces a YaRN block's factor; on any other
  scheme (llama3, longrope, ...) it is refused, because the two rotations do
  not compose.
- The --yarn-* knobs act only on a YaRN rotation.  mlx-lm's YaRN table is
  the full mix (upstream's ext_factor 1.0, its YaRN default), with the
  magnitude upstream then derives from the factor; another
  --yarn-ext-factor rebuilds the table with ggml's blend (`_remix`), and
  --yarn-attn-factor counts only when that mix is 0, as upstream.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from ..config import RopeOverrides

YARN_ORIG_CTX_FALLBACK = 4096   # upstream YarnRoPE's default
FULL_MIX = 1.0                  # the extrapolation mix mlx-lm's YaRN table computes
COMPOSABLE = (None, "default", "linear", "yarn")


class RopeError(ValueError):
    """An override this checkpoint cannot honour; the message names the flag."""


def _block_type(block: dict | None) -> str | None:
    if not block:
        return None
    return block.get("type") or block.get("rope_type") or "default"


def declared_block(config: dict[str, Any]) -> dict | None:
    """The checkpoint's scaling block: `rope_scaling`, or the scaling half of
    transformers 5's nested `rope_parameters` (which mlx-lm falls back to)."""
    block = config.get("rope_scaling")
    if block is None and isinstance(config.get("rope_parameters"), dict):
        nested = {k: v for k, v in config["rope_parameters"].items() if k != "rope_theta"}
        if _block_type(nested) not in (None, "default"):
            block = nested
    return block


def freq_scale(o: RopeOverrides) -> float | None:
    """The requested rope_freq_scale (None = the checkpoint's)."""
    if o.freq_scale:
        return o.freq_scale
    if o.scale:
        return 1.0 / o.scale
    return None


def patch(o: RopeOverrides, config: dict[str, Any]) -> dict[str, Any]:
    """The config keys to rewrite ({} when the overrides change nothing)."""
    out: dict[str, Any] = {}
    if o.freq_base:
        out["rope_theta"] = o.freq_base
    block = declared_block(config)
    kind = _block_type(block)
    fs = freq_scale(o)
    scaling = o.scaling
    if scaling is None and fs is not None:
        if kind not in COMPOSABLE:
            raise RopeError(
                f"--rope-scale/--rope-freq-scale on a checkpoint whose rope_scaling is "
                f"{kind!r}: the two rotations do not compose; name the scheme with "
                "--rope-scaling linear (or none)")
        scaling = "yarn" if kind == "yarn" else "linear"
    if scaling == "none":
        out["rope_scaling"] = None
    elif scaling == "linear":
        factor = 1.0 / fs if fs is not None else float((block or {}).get("factor", 1.0))
        out["rope_scaling"] = {"type": "linear", "factor": factor}
    elif scaling == "yarn" or (kind == "yarn" and _yarn_knobs(o)):
        out["rope_scaling"] = _yarn_block(o, config, block if kind == "yarn" else None, fs)
    return out


def _yarn_knobs(o: RopeOverrides) -> bool:
    return (o.yarn_orig_ctx != 0 or o.yarn_beta_fast >= 0 or o.yarn_beta_slow >= 0)


def _yarn_block(o: RopeOverrides, config: dict, block: dict | None,
                fs: float | None) -> dict[str, Any]:
    own = dict(block or {})
    factor = 1.0 / fs if fs is not None else float(own.get("factor", 1.0))
    orig = (o.yarn_orig_ctx or own.get("original_max_position_embeddings")
            or config.get("max_position_embeddings") or YARN_ORIG_CTX_FALLBACK)
    own.pop("rope_type", None)
    own.update(type="yarn", factor=factor, original_max_position_embeddings=int(orig),
               beta_fast=o.yarn_beta_fast if o.yarn_beta_fast >= 0 else own.get("beta_fast", 32),
               beta_slow=o.yarn_beta_slow if o.yarn_beta_slow >= 0 else own.get("beta_slow", 1))
    return own


def _rope_types() -> tuple[type, ...]:
    import mlx.nn as nn
    from mlx_lm.models import rope_utils as ru

    return (nn.RoPE, ru.SuScaledRoPE, ru.Llama3RoPE, ru.YarnRoPE, ru.ProportionalRoPE,
            ru.DynamicNTKScalingRoPE)


def load(path: Path, o: RopeOverrides, lazy: bool = False):
    """(model, config) from mlx-lm, built with the overrides; RopeError when
    the checkpoint's family would not apply them.  `lazy`: the weights are
    read when first evaluated (mlx-lm's own flag)."""
    from mlx_lm.models import rope_utils
    from mlx_lm.utils import load_config, load_model

    # an integrated VLM's text model too, and Gemma 3n's in either tensor layout
    from .audio_chat import model_classes as _get_classes

    if not o.any:
        return load_model(path, lazy=lazy, get_model_classes=_get_classes)
    base_config = load_config(path)
    changes = patch(o, base_config)
    want_theta = changes.get("rope_theta")
    want_block = changes.get("rope_scaling", declared_block(base_config))
    remix = _block_type(want_block) == "yarn" and (
        o.yarn_ext_factor >= 0 and o.yarn_ext_factor != FULL_MIX)
    if not changes and not remix:
        return load_model(path, lazy=lazy, get_model_classes=_get_classes)  # e.g. --yarn-* against a non-YaRN rotation: inert
    original = rope_utils.initialize_rope
    honoured: dict[int, float] = {}   # rotary module -> the base it was built with
    patched: list[Any] = []

    def counting(dims, base, traditional, scaling_config=None, *args, **kw):
        rope = original(dims, base, traditional, scaling_config, *args, **kw)
        theta_ok = want_theta is None or base == want_theta
        block_ok = "rope_scaling" not in changes or scaling_config == want_block
        if theta_ok and block_ok:
            honoured[id(rope)] = base
        return rope

    def classes(config):
        found = _get_classes(config)
        # models bind initialize_rope by name at import: wrap every binding
        # (a family may build its layers from another family's module)
        for mod in list(sys.modules.values()):
            if (getattr(mod, "__name__", "").startswith("mlx_lm.models.")
                    and getattr(mod, "initialize_rope", None) is original):
                mod.initialize_rope = counting
                patched.append(mod)
        return found

    try:
        model, config = load_model(path, lazy=lazy, model_config=changes,
                                   get_model_classes=classes)
    finally:
        for mod in patched:
            mod.initialize_rope = original
    ropes = [m for _, m in model.named_modules() if isinstance(m, _rope_types())]
    if not ropes or any(id(m) not in honoured for m in ropes):
        raise RopeError(
            f"the {config.get('model_type', 'unknown')} checkpoint at {path} builds its "
            f"rotary embedding without the override ({_describe(o)}): "
            f"{len([m for m in ropes if id(m) in honoured])} of {len(ropes)} rotary "
            "modules honour it; serve it without the RoPE flags")
    if remix:
        for rope in ropes:
            if not isinstance(rope, rope_utils.YarnRoPE):
                raise RopeError(f"--yarn-ext-factor {o.yarn_ext_factor}: a rotary module "
                                f"of the {config.get('model_type')} checkpoint is not mlx-lm's "
                                "YaRN table; omit it")
            _remix(rope, honoured[id(rope)], want_block, o)
    return model, config


def _remix(rope, base: float, block: dict, o: RopeOverrides) -> None:
    """Rebuild a YaRN table for upstream's extrapolation mix `ext` < 1: ggml
    blends the interpolated and extrapolated angles with weight
    ramp * ext, where mlx-lm's table is the ext = 1 case.  With ext = 0 the
    magnitude is --yarn-attn-factor (1 when unset), since upstream derives
    it from the factor only for a non-zero mix."""
    import mlx.core as mx

    dims, ext = rope.dims, o.yarn_ext_factor
    factor = float(block.get("factor", 1.0))
    orig = block.get("original_max_position_embeddings", YARN_ORIG_CTX_FALLBACK)

    def corr_dim(rotations: float) -> float:
        return dims * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(corr_dim(block.get("beta_fast", 32))), 0)
    high = min(math.ceil(corr_dim(block.get("beta_slow", 1))), dims - 1)
    if low == high:
        high += 0.001
    ramp = mx.clip((mx.arange(dims // 2, dtype=mx.float32) - low) / (high - low), 0, 1)
    extrapolate = (1.0 - ramp) * ext
    extra = base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)
    inter = factor * extra
    rope._freqs = (inter * extra) / (inter * extrapolate + extra * (1 - extrapolate))
    if ext == 0:
        rope.mscale = o.yarn_attn_factor if o.yarn_attn_factor >= 0 else 1.0


def _describe(o: RopeOverrides) -> str:
    flags = {"--rope-scaling": o.scaling, "--rope-scale": o.scale,
             "--rope-freq-base": o.freq_base, "--rope-freq-scale": o.freq_scale}
    return ", ".join(f"{k} {v}" for k, v in flags.items() if v is not None) or "--yarn-*"

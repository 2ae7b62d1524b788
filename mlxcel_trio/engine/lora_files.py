"""Reading LoRA adapters from disk into one plain form.

Two layouts are read:

* mlx-lm's (what `mlx_lm.lora` writes): adapter_config.json with
  `fine_tune_type` and `lora_parameters` {rank, scale}, and
  adapters.safetensors holding `<module>.lora_a` (in, r) and
  `<module>.lora_b` (r, out).  The term is `scale * (x @ a) @ b`.
* PEFT's (what Hugging Face's `peft` writes): adapter_config.json with
  `peft_type: LORA`, `r`, `lora_alpha`, `use_rslora`, `rank_pattern`,
  `alpha_pattern`, and adapter_model.safetensors holding
  `base_model.model.<module>.lora_A.weight` (r, in) and `.lora_B.weight`
  (out, r).  Converted at load: the matrices are transposed to mlx-lm's
  orientation, the prefix dropped, and the scaling becomes alpha / r (or
  alpha / sqrt(r) with rsLoRA).

Either way the result is an `Adapter`: per module path (as the mlx-lm model
names its modules, "model.layers.0.self_attn.q_proj"), the two matrices and
the adapter's own scaling, which the user scale multiplies, as upstream
multiplies its alpha / r.  Adapters whose effect is not a scaled low-rank
term (DoRA's magnitude vectors, full-weight fine-tunes, PEFT's trained
embeddings, biases or saved modules) cannot honor a live scale and are
refused with `AdapterError`.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import attrs
import numpy as np

MLX_WEIGHTS = "adapters.safetensors"
PEFT_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."


class AdapterError(Exception):
    """An adapter that cannot be served; the message names the adapter and
    what is wrong with it."""


@attrs.frozen(eq=False)
class LowRank:
    a: np.ndarray      # (in, r)
    b: np.ndarray      # (r, out)
    scaling: float     # the adapter's own multiplier (mlx-lm scale, or alpha / r)


@attrs.frozen(eq=False)
class Adapter:
    path: str                                   # as the user named it
    modules: dict[str, LowRank]
    layout: str                                 # "mlx-lm" or "peft"


def adapter_problem(path: str) -> str | None:
    """Why the adapter at `path` cannot be served, from its config and file
    names alone (nothing is read into memory), or None."""
    try:
        where, config = _config(path)
        if "peft_type" in config:
            _peft_scaling(path, config)
        else:
            _mlx_scaling(path, config)
        weights = where / (PEFT_WEIGHTS if "peft_type" in config else MLX_WEIGHTS)
        if not weights.is_file():
            raise AdapterError(f"{path}: {weights.name} is missing")
    except AdapterError as exc:
        return str(exc)
    return None


def read_adapter(path: str) -> Adapter:
    """The adapter at `path` (a directory, or its adapter_config.json)."""
    where, config = _config(path)
    if "peft_type" in config:
        return _read_peft(path, where, config)
    return _read_mlx(path, where, config)


def _config(path: str) -> tuple[Path, dict]:
    where = Path(path)
    if where.name == "adapter_config.json":
        where = where.parent
    config_file = where / "adapter_config.json"
    if not where.is_dir():
        raise AdapterError(f"{path}: no such adapter directory")
    if not config_file.is_file():
        raise AdapterError(f"{path}: no adapter_config.json (an mlx-lm or PEFT LoRA "
                           "adapter directory is expected)")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{path}: adapter_config.json is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{path}: adapter_config.json is not a JSON object")
    return where, config


def _tensors(path: str, file: Path) -> dict[str, np.ndarray]:
    if not file.is_file():
        raise AdapterError(f"{path}: {file.name} is missing")
    import mlx.core as mx

    try:
        loaded = mx.load(str(file))
    except Exception as exc:
        raise AdapterError(f"{path}: {file.name} cannot be read ({exc})") from None
    # float32 on the host: the engine casts to the model's dtype when it installs
    return {k: np.array(v.astype(mx.float32)) for k, v in loaded.items()}


def _mlx_scaling(path: str, config: dict) -> float:
    """mlx-lm's scale, after refusing what is not a plain LoRA."""
    kind = config.get("fine_tune_type", "lora")
    if kind == "dora":
        raise AdapterError(f"{path}: a DoRA adapter rescales the weights' magnitudes, "
                           "so it cannot be applied at a live scale; fuse it into the "
                           "model with mlx_lm.fuse and serve the result")
    if kind == "full":
        raise AdapterError(f"{path}: a full-weight fine-tune is not a low-rank adapter; "
                           "fuse it into the model with mlx_lm.fuse and serve the result")
    if kind != "lora":
        raise AdapterError(f"{path}: fine_tune_type {kind!r} is not a LoRA adapter")
    params = config.get("lora_parameters") or {}
    scaling = params.get("scale")
    if not isinstance(scaling, (int, float)) or isinstance(scaling, bool) \
            or not math.isfinite(scaling):
        raise AdapterError(f"{path}: lora_parameters.scale must be a number")
    return float(scaling)


def _read_mlx(path: str, where: Path, config: dict) -> Adapter:
    scaling = _mlx_scaling(path, config)
    tensors = _tensors(path, where / MLX_WEIGHTS)
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key, value in tensors.items():
        module, _, leaf = key.rpartition(".")
        if leaf not in ("lora_a", "lora_b"):
            raise AdapterError(f"{path}: tensor {key} is not a LoRA matrix (only "
                               "lora_a / lora_b pairs can be applied at a live scale)")
        pairs.setdefault(module, {})[leaf] = value
    modules = {m: _pair(path, m, p.get("lora_a"), p.get("lora_b"), scaling)
               for m, p in pairs.items()}
    return _checked(Adapter(path, modules, "mlx-lm"))


def _peft_override(patterns: dict, module: str, default: float) -> float:
    """PEFT's rank_pattern / alpha_pattern: a key names a module by its last
    dotted components (or a regex over them)."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return float(value)
    return default


def _peft_scaling(path: str, config: dict) -> tuple[int, float, bool]:
    """PEFT's (r, lora_alpha, use_rslora), after refusing what is not a
    plain LoRA."""
    if str(config.get("peft_type", "")).upper() != "LORA":
        raise AdapterError(f"{path}: peft_type {config.get('peft_type')!r} is not LORA")
    if config.get("use_dora"):
        raise AdapterError(f"{path}: a DoRA adapter rescales the weights' magnitudes, "
                           "so it cannot be applied at a live scale; merge it into the "
                           "model (peft's merge_and_unload) and serve the result")
    if config.get("modules_to_save"):
        raise AdapterError(f"{path}: modules_to_save stores full weights, which no scale "
                           "can apply; merge the adapter into the model and serve the result")
    r, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(r, int) or r <= 0 or not isinstance(alpha, (int, float)):
        raise AdapterError(f"{path}: adapter_config.json needs a positive integer r "
                           "and a numeric lora_alpha")
    return r, float(alpha), bool(config.get("use_rslora"))


def _read_peft(path: str, where: Path, config: dict) -> Adapter:
    r, alpha, rslora = _peft_scaling(path, config)
    tensors = _tensors(path, where / PEFT_WEIGHTS)
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key, value in tensors.items():
        match = re.fullmatch(r"(?:base_model\.model\.)?(.+)\.(lora_A|lora_B)(?:\.[^.]+)?\.weight",
                             key)
        if match is None:
            raise AdapterError(f"{path}: tensor {key} is not a LoRA matrix (embedding "
                               "adapters, biases and saved modules cannot be applied at a "
                               "live scale)")
        module, leaf = match.groups()
        pairs.setdefault(module, {})[leaf] = value
    modules = {}
    for module, p in pairs.items():
        a, b = p.get("lora_A"), p.get("lora_B")
        rank = _peft_override(config.get("rank_pattern"), module, r)
        alpha_m = _peft_override(config.get("alpha_pattern"), module, float(alpha))
        scaling = alpha_m / (math.sqrt(rank) if rslora else rank)
        modules[module] = _pair(path, module, None if a is None else a.T,
                                None if b is None else b.T, scaling)
    return _checked(Adapter(path, modules, "peft"))


def _pair(path: str, module: str, a, b, scaling: float) -> LowRank:
    if a is None or b is None:
        raise AdapterError(f"{path}: module {module} has only one of its two LoRA matrices")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise AdapterError(f"{path}: module {module}: LoRA matrices of shapes "
                           f"{tuple(a.shape)} and {tuple(b.shape)} do not chain")
    return LowRank(np.ascontiguousarray(a), np.ascontiguousarray(b), scaling)


def _checked(adapter: Adapter) -> Adapter:
    if not adapter.modules:
        raise AdapterError(f"{adapter.path}: the adapter holds no LoRA matrices")
    return adapter

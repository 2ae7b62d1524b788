"""Which model architectures mlx-lm can build, asked before anything loads.

mlx-lm picks a model class from config.json's `model_type` (through its
remapping tables, e.g. `mistral` -> `llama`) and fails deep inside its loader
when the module does not exist.  The server asks first, so an unsupported
checkpoint is one line naming the architecture and the supported list,
before the socket listens and before any weight is read.
"""

from __future__ import annotations

import importlib.util
import json
import pkgutil
from pathlib import Path

from ..protocol.kv_types import DEFAULT_PAIR as DEFAULT_KV


def supported() -> list[str]:
    """Every `model_type` this mlx-lm builds: its model modules (less the
    shared helpers) and the names its remapping table accepts."""
    import mlx_lm.models
    from mlx_lm.utils import MODEL_REMAPPING

    helpers = {"base", "cache", "rope_utils", "switch_layers", "activations", "pipeline",
               "ssm", "gated_delta", "bitlinear_layers", "mla"}
    names = {m.name for m in pkgutil.iter_modules(mlx_lm.models.__path__)
             if not m.name.startswith("_") and m.name not in helpers}
    return sorted(names | set(MODEL_REMAPPING))


def problem(path: str | Path, kv_types: tuple[str, str] = DEFAULT_KV) -> str | None:
    """None when mlx-lm can build the checkpoint at `path` and give it the
    KV cache types `kv_types`, else one line."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError) as exc:
        return f"cannot read {Path(path) / 'config.json'}: {exc}"
    if not isinstance(config, dict) or not config.get("model_type"):
        return "config.json names no model_type, so no mlx-lm architecture can be chosen"
    from .towers.vlm_config import is_vlm
    from .vision import text_problem

    if is_vlm(config):
        return text_problem(config) or kv_problem(config, *kv_types)
    from .mlx_lm_internals import resolved_type

    module = resolved_type(config)
    if importlib.util.find_spec(f"mlx_lm.models.{module}") is not None:
        from . import audio_chat

        reason = audio_chat.problem(config) if audio_chat.is_audio_chat(config) else None
        return reason or kv_problem(config, *kv_types)
    return (f"unsupported model architecture '{config['model_type']}': mlx-lm "
            f"builds {', '.join(supported())}")


def head_dim(config: dict) -> int | None:
    """The attention head width config.json declares (or implies)."""
    text = config.get("text_config")
    cfg = text if isinstance(text, dict) else config
    width = cfg.get("head_dim")
    if not width and cfg.get("hidden_size") and cfg.get("num_attention_heads"):
        width = int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])
    return int(width) if width else None


def kv_problem(config: dict, k: str, v: str) -> str | None:
    """Why this checkpoint's heads cannot hold a quantized KV cache, or None."""
    from ..protocol.kv_types import head_problem

    width = head_dim(config)
    reason = head_problem(k, v, width) if width else None
    if reason:
        return f"-ctk {k} -ctv {v}: {reason}"
    return None if (k, v) == DEFAULT_KV else cache_kinds_problem(config, k, v)


def cache_kinds_problem(config: dict, k: str, v: str) -> str | None:
    """Why this checkpoint's per-layer cache kinds cannot take the KV types
    (no layer can: every attention layer a sliding window, which has no
    quantized form), or None.  The model class is
    built without weights (its parameters stay lazy, nothing is allocated)
    only to ask its own `make_cache`, the list a loaded model would give.
    A class that cannot be built so is left to the load-time check."""
    from mlx_lm.models.cache import make_prompt_cache

    from .kv_cache import layers_problem
    from .mlx_lm_internals import get_classes
    from .towers.vlm_config import is_vlm, text_config

    cfg = text_config(config) if is_vlm(config) else config
    try:
        model_cls, args_cls = get_classes(cfg)
        layers = make_prompt_cache(model_cls(args_cls.from_dict(cfg)))
    except Exception:  # noqa: BLE001 - the engine's own check runs after the load
        return None
    return layers_problem((k, v), layers)

"""Memory sized to the machine: the prompt cache's default budget, and the
refusal of a configuration that cannot fit.

Upstream's --cache-ram default (8192 MiB) suits a large machine.  The cache
holds only what finished requests donated and is LRU-evicted at its budget,
so the budget is a ceiling, not a reservation; but a server under load fills
it, and on a small machine 8 GiB of cached KV beside the model is a slow
out-of-memory.  So when --cache-ram is not given the budget follows the
machine: a quarter of the memory available once the model's weights are
in (AUTO_SHARE), never above upstream's 8192 MiB; the other three quarters
stay for the slots' KV (which mlx-lm grows as sequences lengthen), the
activations and everything else.  The figure is said in the load summary.

Refused before the model loads, naming the figures: weights larger than the
memory available, or weights plus an explicit --cache-ram that cannot fit.
Where a full context on every slot would not fit beside them, a warning says
so (MLX grows each slot's KV as it fills, so such a server still serves
shorter sequences; upstream reserves the whole KV at load instead).

"Available" is Linux's MemAvailable at startup; where the OS does not say
(macOS), nothing is checked and upstream's default stands.  Nothing here
imports MLX: the runner asks before the engine thread starts.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs

from .config import ServerConfig
from .protocol.kv_types import KV_CACHE_TYPES

MIB = 1 << 20
CEILING_MIB = 8192      # upstream's --cache-ram default
AUTO_SHARE = 4          # the auto budget: 1/AUTO_SHARE of what the weights leave


def available_bytes() -> int | None:
    """MemAvailable on Linux; None where the OS does not say (the engine's
    weight policy asks it too)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def weight_bytes(model_dir: str | Path) -> int:
    """The checkpoint's weight files, as stored."""
    return sum(p.stat().st_size for p in Path(model_dir).glob("*.safetensors"))


def _text_config(model_dir: str | Path) -> dict:
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    text = cfg.get("text_config") if isinstance(cfg, dict) else None
    return text if isinstance(text, dict) else cfg if isinstance(cfg, dict) else {}


def kv_bytes_per_token(model_dir: str | Path, kv_types: tuple[str, str]) -> int:
    """K and V bytes one token costs across the layers (0 when config.json
    does not say enough)."""
    cfg = _text_config(model_dir)
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
        width = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // int(
            cfg["num_attention_heads"]))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return 0
    native = 4 if cfg.get("torch_dtype") == "float32" else 2
    total = 0.0
    for kind in kv_types:
        fmt = KV_CACHE_TYPES.get(kind)
        if fmt is not None and fmt.quantized:
            # packed values, plus a float16 scale and bias per group
            total += fmt.bits / 8 + 4 / fmt.group_size
        elif fmt is not None and fmt.dtype == "float32":
            total += 4
        elif fmt is not None and fmt.dtype == "bfloat16":
            total += 2
        else:
            total += native
    return int(layers * heads * width * total)


def context_tokens(config: ServerConfig) -> int:
    """Every slot's context together (-c; 0: the checkpoint's trained one)."""
    if config.ctx_size:
        return config.ctx_size
    cfg = _text_config(config.model)
    return int(cfg.get("max_position_embeddings") or 4096)


@attrs.frozen
class Fit:
    """The outcome of sizing: the config to serve with (its cache_ram
    resolved), the line for the load summary, a warning, or a refusal."""

    config: ServerConfig
    summary: str | None = None
    warning: str | None = None
    problem: str | None = None


def _mib(n: int) -> str:
    return f"{n // MIB} MiB"


def size(config: ServerConfig, available: int | None = None) -> Fit:
    """Resolve an unset --cache-ram to the machine and check what must fit."""
    available = available_bytes() if available is None else available
    if available is None or config.router or not config.model:
        return Fit(config)
    weights = weight_bytes(config.model)
    if weights > available:
        return Fit(config, problem=(
            f"the model's weights take {_mib(weights)}, more than the {_mib(available)} of "
            "memory available; free memory, or serve a smaller or quantized checkpoint"))
    left = available - weights
    summary = None
    if config.cache_ram_auto:
        mib = min(CEILING_MIB, left // AUTO_SHARE // MIB)
        config = attrs.evolve(config, cache_ram=mib)
        summary = (f"cache_ram = {mib} MiB (sized to this machine: a quarter of the "
                   f"{_mib(left)} available beside the model's {_mib(weights)}, at most "
                   f"{CEILING_MIB}; --cache-ram sets it)")
    elif config.cache_ram > 0 and weights + config.cache_ram * MIB > available:
        return Fit(config, problem=(
            f"--cache-ram {config.cache_ram}: the model's {_mib(weights)} plus a prompt cache "
            f"of {config.cache_ram} MiB need {_mib(weights + config.cache_ram * MIB)}, but "
            f"only {_mib(available)} is available; lower --cache-ram, or leave it unset "
            "to size it to this machine"))
    cache = max(0, config.cache_ram) * MIB
    kv = kv_bytes_per_token(config.model, (config.cache_type_k, config.cache_type_v)) * \
        context_tokens(config)
    warning = None
    if kv and weights + cache + kv > available:
        warning = (f"a full context on every slot ({context_tokens(config)} tokens, "
                   f"{_mib(kv)} of KV) would not fit beside the model's {_mib(weights)} and "
                   f"the prompt cache's {_mib(cache)} in the {_mib(available)} available; "
                   "lower -c, or quantize the KV cache (-ctk q8_0 -ctv q8_0)")
    return Fit(config, summary=summary, warning=warning)

"""The load summary's "choices" line: every speculative, LoRA, KV-type and
BLAS decision in force, named once after the model loads, so an operator
sees that `--spec-type ngram-simple` (or a quantized KV cache, or an
adapter) is on without reading /props."""

from __future__ import annotations

from pathlib import Path

from .. import blas
from ..config import ServerConfig


def choices_line(config: ServerConfig) -> str:
    spec = config.speculative
    if spec.types:
        drafter = f", draft model {Path(spec.draft_model).name}" if spec.draft_model else ""
        speculative = (f"speculative {','.join(spec.types)} (draft {spec.n_min}..{spec.n_max} "
                       f"tokens{drafter})")
    else:
        speculative = "speculative off"
    if config.adapters:
        scale = "0 until set (--lora-init-without-apply)" if config.lora_init_without_apply \
            else None
        named = ", ".join(f"{Path(p).name} x{s:g}" for p, s in config.adapters)
        lora = f"LoRA {named}" + (f", scales {scale}" if scale else "")
    else:
        lora = "LoRA none"
    kv = f"KV cache K {config.cache_type_k}, V {config.cache_type_v}"
    library = blas.preloaded()
    math = (f"BLAS {Path(library).name} (--blas {config.blas})" if library
            else f"BLAS MLX's bundled (--blas {config.blas})")
    return f"main: choices: {speculative} | {lora} | {kv} | {math}"

"""Context, batching, the prompt cache and RoPE overrides.

--context-shift, --keep, --cont-batching and the RoPE / YaRN overrides act
(engine/scheduler.py, engine/rope.py); values no MLX rotation can express
are refused here, before any model is resolved.

--cache-prompt, --cache-ram and --cache-reuse drive the prompt cache
(engine/prompt_cache.py, engine/kv_shift.py);
--cache-disk and --cache-disk-mib, mlxcel-trio's own, its disk tier
(engine/cache_disk.py).
-kvu / --kv-unified (on by default when -np is auto) makes the context one
budget shared by every slot (engine/kv_budget.py); --cache-idle-slots clears
an idle slot's retained tokens when a task starts under it.
The per-slot prompt machinery (--ctx-checkpoints, --checkpoint-min-step,
--slot-prompt-similarity) is not applicable: it accepts
only the value that turns it off (its upstream default asks for behaviour
that does not exist here) and refuses the rest saying what is missing.
--ubatch-size has no MLX meaning; --swa-full only shapes memory, so it is
a tuning option (accepted, and named at startup as having no effect).
"""

from __future__ import annotations

from typing import Any

import attrs

from mlxcel_trio.cli.options_sampling import row_default, row_domain
from mlxcel_trio.cli.record import Option
from mlxcel_trio.cli.refusals import ALWAYS, equals, not_applicable, tuning
from mlxcel_trio.cli.values import INT32_MAX, BadValue, Choice, Float, Int, Text

CONTEXT_ISSUE = 8
CACHE_DISK_DEFAULT_MIB = 16384


# --cache-ram's unset default, upstream's: a ceiling, not a reservation (the
# cache holds only what finished requests donated, LRU-evicted past it).
CACHE_RAM_DEFAULT_MIB = 8192

NO_CHECKPOINTS = ("there are no context checkpoints: a sequence's KV is kept whole "
                  "and prefixes are reused through the process-wide prompt cache")


def _slot_machinery(spellings: tuple[str, ...], dest: str, help: str, **kw: Any) -> Option:
    """Per-slot prompt machinery upstream has and this server does not: the
    inert value passes, the rest is refused saying what is missing."""
    kw.setdefault("section", "server")
    return not_applicable(spellings, dest, help, owner=CONTEXT_ISSUE, **kw)


CONTEXT: tuple[Option, ...] = (
    not_applicable(("-ub", "--ubatch-size"), "ubatch_size",
                   "physical batch size (no separate micro-batch exists under MLX; "
                   "logged at startup); the embedding and rerank routes refuse an input "
                   "longer than it, as upstream",
                   value=Int(1, INT32_MAX), metavar="N", default=512,
                   env="LLAMA_ARG_UBATCH", owner=CONTEXT_ISSUE, why="", inert=ALWAYS,
                   accepts="any value (MLX has no separate physical micro-batch)"),
    Option(("--keep",), "n_keep",
           "tokens of the prompt kept when the context shifts (the default n_keep)",
           value=row_domain("n_keep"), metavar="N", default=row_default("n_keep"),
           default_text=f"{row_default('n_keep')}, -1 = all",
           owner=CONTEXT_ISSUE),
    # memory only: sliding-window layers keep the ring cache their checkpoint sizes
    tuning(("--swa-full",), "swa_full", "full-size cache for sliding-window layers",
           kind="flag", env="LLAMA_ARG_SWA_FULL", default_text="false", owner=CONTEXT_ISSUE),
    _slot_machinery(("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints"), "ctx_checkpoints",
                    "context checkpoints kept per slot", value=Int(0, INT32_MAX),
                    metavar="N", default=32, env="LLAMA_ARG_CTX_CHECKPOINTS",
                    why=NO_CHECKPOINTS, inert=equals(0), accepts="0"),
    _slot_machinery(("-cms", "--checkpoint-min-step"), "checkpoint_min_step",
                    "fewest tokens between two context checkpoints",
                    value=Int(0, INT32_MAX), metavar="N", default=8192,
                    default_text="8192, 0 = no minimum",
                    env="LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT", why=NO_CHECKPOINTS,
                    inert=equals(8192), accepts="8192"),
    Option(("-cram", "--cache-ram"), "cache_ram",
           "prompt cache budget in MiB (the KV of cached prompt prefixes)",
           value=Int(-1, INT32_MAX), metavar="N", default=CACHE_RAM_DEFAULT_MIB,
           default_text=f"{CACHE_RAM_DEFAULT_MIB}, -1 - no limit, 0 - disable",
           env="LLAMA_ARG_CACHE_RAM", section="server", owner=CONTEXT_ISSUE),
    Option(("--cache-disk",), "cache_disk",
           "mlxcel-trio: directory of the prompt cache's disk tier: every cached prefix "
           "is also kept there as a checksummed safetensors file, read back on a hit, "
           "so cached prompts survive a restart",
           value=Text(), metavar="DIR", default_text="disabled", env="MLXCEL_CACHE_DISK",
           section="server", upstream=False, owner=CONTEXT_ISSUE),
    Option(("--cache-disk-mib",), "cache_disk_mib",
           "mlxcel-trio: byte budget of --cache-disk in MiB (oldest files deleted first)",
           value=Int(-1, INT32_MAX), metavar="N", default=CACHE_DISK_DEFAULT_MIB,
           default_text=f"{CACHE_DISK_DEFAULT_MIB}, -1 - no limit",
           env="MLXCEL_CACHE_DISK_MIB", section="server", upstream=False, owner=CONTEXT_ISSUE),
    # the budget only: mlx-lm's batch caches hold each sequence at its own
    # length, so unified KV is accounting (engine/kv_budget.py), not a buffer
    Option(("-kvu", "--kv-unified"), "kv_unified",
           "use single unified KV buffer shared across all sequences: one sequence may "
           "use the whole context, and all of them together hold at most that much",
           kind="bool", negations=("-no-kvu", "--no-kv-unified"),
           default_text="enabled if number of slots is auto", env="LLAMA_ARG_KV_UNIFIED",
           section="server", owner=CONTEXT_ISSUE),
    # finished sequences already leave their KV to the prompt cache; this
    # decides whether a slot also forgets the tokens it last held when
    # another task starts (under unified KV), as upstream's does
    Option(("--cache-idle-slots",), "cache_idle_slots",
           "save idle slots to the prompt cache on new task, and clear them when using "
           "unified KV", kind="bool", negations=("--no-cache-idle-slots",), default=True,
           default_text="enabled, requires cache-ram", env="LLAMA_ARG_CACHE_IDLE_SLOTS",
           section="server", owner=CONTEXT_ISSUE),
    Option(("--context-shift",), "context_shift",
           "when a generation fills its slot's context, drop old tokens (after "
           "n_keep) and continue instead of stopping", kind="bool",
           negations=("--no-context-shift",), default=False, env="LLAMA_ARG_CONTEXT_SHIFT",
           section="server", owner=CONTEXT_ISSUE),
    Option(("-cb", "--cont-batching"), "cont_batching",
           "continuous batching: new prompts join while other slots decode "
           "(disabled: they wait until no slot decodes)", kind="bool",
           negations=("-nocb", "--no-cont-batching"), default=True,
           env="LLAMA_ARG_CONT_BATCHING", section="server", owner=CONTEXT_ISSUE),
    Option(("--cache-prompt",), "cache_prompt",
           "default of the per-request cache_prompt: reuse a cached prompt prefix's KV",
           kind="bool", negations=("--no-cache-prompt",), default=row_default("cache_prompt"),
           env="LLAMA_ARG_CACHE_PROMPT", section="server", owner=CONTEXT_ISSUE),
    Option(("--cache-reuse",), "cache_reuse",
           "min chunk size to attempt reusing from the cache via KV shifting, requires "
           "prompt caching to be enabled (the default of the per-request n_cache_reuse)",
           value=Int(0, INT32_MAX), metavar="N", default=row_default("n_cache_reuse"),
           env="LLAMA_ARG_CACHE_REUSE", section="server", owner=CONTEXT_ISSUE),
    _slot_machinery(("-sps", "--slot-prompt-similarity"), "slot_prompt_similarity",
                    "how closely a prompt must match a slot's to reuse that slot",
                    value=Float(0.0, 1.0), metavar="SIMILARITY", default=0.1,
                    default_text="0.10, 0.0 = disabled",
                    why="no slot keeps a prompt of its own to be matched: every request "
                    "consults the process-wide prompt cache whichever slot serves it",
                    inert=equals(0.0), accepts="0.0"),
)

@attrs.frozen
class PositiveFloat:
    """A finite number above 0 (a scale of 0 has no rotation)."""

    domain: str = "a number above 0"

    def parse(self, text: str) -> float:
        value = Float().parse(text)
        if value <= 0:
            raise BadValue("out of range")
        return value


def _rope(spelling: str, dest: str, help: str, **kw: Any) -> Option:
    kw.setdefault("owner", CONTEXT_ISSUE)
    return Option((spelling,), dest, help, **kw)


ROPE: tuple[Option, ...] = (
    _rope("--rope-scaling", "rope.scaling",
          "RoPE frequency scaling method, defaults to linear unless specified by the model",
          value=Choice(("none", "linear", "yarn")), metavar="{none,linear,yarn}",
          env="LLAMA_ARG_ROPE_SCALING_TYPE"),
    _rope("--rope-scale", "rope.scale",
          "RoPE context scaling factor, expands context by a factor of N",
          value=PositiveFloat(), metavar="N", env="LLAMA_ARG_ROPE_SCALE"),
    _rope("--rope-freq-base", "rope.freq_base",
          "RoPE base frequency",
          value=Float(lo=0.0), metavar="N", default_text="loaded from model",
          env="LLAMA_ARG_ROPE_FREQ_BASE"),
    _rope("--rope-freq-scale", "rope.freq_scale",
          "RoPE frequency scaling factor, expands context by a factor of 1/N",
          value=Float(lo=0.0), metavar="N", env="LLAMA_ARG_ROPE_FREQ_SCALE"),
    _rope("--yarn-orig-ctx", "rope.yarn_orig_ctx",
          "YaRN: original context size of model",
          value=Int(0, INT32_MAX), metavar="N", default=0,
          default_text="0 = model training context size", env="LLAMA_ARG_YARN_ORIG_CTX"),
    _rope("--yarn-ext-factor", "rope.yarn_ext_factor", "YaRN: extrapolation mix factor",
          value=Float(), metavar="N", default=-1.0,
          default_text="-1.00, 0.0 = full interpolation", env="LLAMA_ARG_YARN_EXT_FACTOR"),
    _rope("--yarn-attn-factor", "rope.yarn_attn_factor",
          "YaRN: scale sqrt(t) or attention magnitude",
          value=Float(), metavar="N", default=-1.0, default_text="-1.00",
          env="LLAMA_ARG_YARN_ATTN_FACTOR"),
    _rope("--yarn-beta-slow", "rope.yarn_beta_slow", "YaRN: high correction dim or alpha",
          value=Float(), metavar="N", default=-1.0, default_text="-1.00",
          env="LLAMA_ARG_YARN_BETA_SLOW"),
    _rope("--yarn-beta-fast", "rope.yarn_beta_fast", "YaRN: low correction dim or beta",
          value=Float(), metavar="N", default=-1.0, default_text="-1.00",
          env="LLAMA_ARG_YARN_BETA_FAST"),
)


def rope_reciprocal_refusal(scale: float | None, freq_scale: float | None) -> str | None:
    """--rope-scale N and --rope-freq-scale M set one value upstream (the
    last one wins); both given must agree rather than race."""
    if scale is None or freq_scale is None or not scale > 0:
        return None
    if abs(freq_scale * scale - 1.0) <= 1e-6:
        return None
    return (f"not the reciprocal of --rope-scale {scale:g} (both set the same "
            "rotation: --rope-freq-scale M is --rope-scale 1/M); pass only one of them")

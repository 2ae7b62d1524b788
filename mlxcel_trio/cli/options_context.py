"""Context, batching, the prompt cache and RoPE overrides (issue #8).

Deferred options accept upstream's default or the value asking for nothing.
The per-slot prompt machinery (--kv-unified, --ctx-checkpoints,
--slot-prompt-similarity, --cache-idle-slots) accepts only the value that
turns it off: its upstream default asks for behaviour that does not exist
here.  --cache-reuse, --swa-full and --ubatch-size have no MLX meaning.
"""

from __future__ import annotations

from typing import Any

from mlxcel_trio.cli.record import Option
from mlxcel_trio.cli.refusals import ALWAYS, deferred, equals, not_applicable
from mlxcel_trio.cli.values import INT32_MAX, Choice, Float, Int

CONTEXT_ISSUE = 8


def _c(spellings: tuple[str, ...], dest: str, help: str, **kw: Any) -> Option:
    kw.setdefault("section", "server")
    return deferred(spellings, dest, help, issue=CONTEXT_ISSUE, **kw)


def _rope(spelling: str, dest: str, help: str, **kw: Any) -> Option:
    return deferred((spelling,), dest, help, issue=CONTEXT_ISSUE, **kw)


CONTEXT: tuple[Option, ...] = (
    not_applicable(("-ub", "--ubatch-size"), "ubatch_size",
                   "physical batch size (no separate micro-batch exists under MLX)",
                   value=Int(1, INT32_MAX), metavar="N", default=512,
                   env="LLAMA_ARG_UBATCH", owner=CONTEXT_ISSUE, why="", inert=ALWAYS,
                   accepts="any value (MLX has no separate physical micro-batch)"),
    _c(("--keep",), "n_keep", "prompt tokens kept when the context shifts",
       value=Int(-1, INT32_MAX), metavar="N", default=0, default_text="0, -1 = all",
       section="common"),
    not_applicable(("--swa-full",), "swa_full", "full-size cache for sliding-window layers",
                   kind="flag", env="LLAMA_ARG_SWA_FULL", default_text="false",
                   owner=CONTEXT_ISSUE,
                   why="sliding-window layers keep the ring cache their checkpoint "
                   "sizes; there is no full-size SWA cache to ask for"),
    _c(("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints"), "ctx_checkpoints",
       "context checkpoints kept per slot", value=Int(0, INT32_MAX), metavar="N",
       default=32, env="LLAMA_ARG_CTX_CHECKPOINTS", inert=equals(0), accepts="0"),
    _c(("-cms", "--checkpoint-min-step"), "checkpoint_min_step",
       "fewest tokens between two context checkpoints", value=Int(0, INT32_MAX),
       metavar="N", default=8192, default_text="8192, 0 = no minimum",
       env="LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT"),
    _c(("-cram", "--cache-ram"), "cache_ram", "prompt cache budget in MiB",
       value=Int(-1, INT32_MAX), metavar="N", default=8192,
       default_text="8192, -1 - no limit, 0 - disable", env="LLAMA_ARG_CACHE_RAM",
       inert=equals(8192, 0), accepts="8192 or 0"),
    _c(("-kvu", "--kv-unified"), "kv_unified", "one KV buffer shared by every slot",
       kind="bool", negations=("-no-kvu", "--no-kv-unified"),
       default_text="enabled if number of slots is auto", env="LLAMA_ARG_KV_UNIFIED",
       inert=equals(False), accepts="--no-kv-unified"),
    _c(("--cache-idle-slots",), "cache_idle_slots",
       "save idle slots to the prompt cache when a new task arrives", kind="bool",
       negations=("--no-cache-idle-slots",), default=True,
       default_text="enabled, requires cache-ram", env="LLAMA_ARG_CACHE_IDLE_SLOTS",
       inert=equals(False), accepts="--no-cache-idle-slots"),
    _c(("--context-shift",), "context_shift",
       "drop old tokens to keep generating past a full context", kind="bool",
       negations=("--no-context-shift",), default=False, env="LLAMA_ARG_CONTEXT_SHIFT"),
    _c(("-cb", "--cont-batching"), "cont_batching",
       "continuous batching: admit new requests between decode steps", kind="bool",
       negations=("-nocb", "--no-cont-batching"), default=True,
       env="LLAMA_ARG_CONT_BATCHING"),
    _c(("--cache-prompt",), "cache_prompt", "reuse the KV of a previous prompt's prefix",
       kind="bool", negations=("--no-cache-prompt",), default=True,
       env="LLAMA_ARG_CACHE_PROMPT"),
    not_applicable(("--cache-reuse",), "cache_reuse",
                   "smallest chunk reused from the cache by shifting it",
                   value=Int(0, INT32_MAX), metavar="N", default=0,
                   env="LLAMA_ARG_CACHE_REUSE", owner=CONTEXT_ISSUE, section="server",
                   why="reusing a chunk that is not a prefix needs re-rotating cached "
                   "keys, which the MLX KV cache cannot do",
                   inert=equals(0), accepts="0"),
    _c(("-sps", "--slot-prompt-similarity"), "slot_prompt_similarity",
       "how closely a prompt must match a slot's to reuse that slot",
       value=Float(0.0, 1.0), metavar="SIMILARITY", default=0.1,
       default_text="0.10, 0.0 = disabled", inert=equals(0.0), accepts="0.0"),
)

ROPE: tuple[Option, ...] = (
    _rope("--rope-scaling", "rope_scaling", "RoPE scaling method",
          value=Choice(("none", "linear", "yarn")), metavar="{none,linear,yarn}",
          env="LLAMA_ARG_ROPE_SCALING_TYPE"),
    _rope("--rope-scale", "rope_scale", "RoPE context scaling factor",
          value=Float(), metavar="N", env="LLAMA_ARG_ROPE_SCALE"),
    _rope("--rope-freq-base", "rope_freq_base", "RoPE base frequency",
          value=Float(), metavar="N", default_text="loaded from model",
          env="LLAMA_ARG_ROPE_FREQ_BASE"),
    _rope("--rope-freq-scale", "rope_freq_scale", "RoPE frequency scaling factor",
          value=Float(), metavar="N", env="LLAMA_ARG_ROPE_FREQ_SCALE"),
    _rope("--yarn-orig-ctx", "yarn_orig_ctx", "YaRN: the model's original context size",
          value=Int(0, INT32_MAX), metavar="N", default=0,
          default_text="0 = model training context size",
          env="LLAMA_ARG_YARN_ORIG_CTX", accepts="0"),
    _rope("--yarn-ext-factor", "yarn_ext_factor", "YaRN: extrapolation mix",
          value=Float(), metavar="N", default=-1.0,
          default_text="-1.00, 0.0 = full interpolation", env="LLAMA_ARG_YARN_EXT_FACTOR"),
    _rope("--yarn-attn-factor", "yarn_attn_factor", "YaRN: attention magnitude scale",
          value=Float(), metavar="N", default=-1.0, default_text="-1.00",
          env="LLAMA_ARG_YARN_ATTN_FACTOR"),
    _rope("--yarn-beta-slow", "yarn_beta_slow", "YaRN: high correction dimension",
          value=Float(), metavar="N", default=-1.0, default_text="-1.00",
          env="LLAMA_ARG_YARN_BETA_SLOW"),
    _rope("--yarn-beta-fast", "yarn_beta_fast", "YaRN: low correction dimension",
          value=Float(), metavar="N", default=-1.0, default_text="-1.00",
          env="LLAMA_ARG_YARN_BETA_FAST"),
)

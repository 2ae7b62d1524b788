"""Speculative decoding: the draft model, its GGML placement, the n-gram
drafters and the options upstream has already removed.

mlxcel-trio has no drafter, so the whole family is not_applicable and
hidden.  Inert values are accepted (upstream's defaults, ``--spec-type
none``, full-offload and f16 spellings for the draft, and any n-gram tuning
value, since no n-gram drafter can be selected); everything that would ask
for speculation is refused before the model load.
"""

from __future__ import annotations

from typing import Any

from mlxcel_trio.cli.options_ggml import CACHE_TYPES
from mlxcel_trio.cli.record import Option
from mlxcel_trio.cli.refusals import (
    ALWAYS,
    NO_DRAFTER,
    NO_PLACEMENT,
    NO_THREADPOOL,
    at_most,
    equals,
    not_applicable,
)
from mlxcel_trio.cli.values import Choice, CsvChoice, Float, GpuLayers, Int, Text

SPEC_TYPES = (
    "none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark",
    "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
)


def _spec(spellings: tuple[str, ...], dest: str, help: str, **kw: Any) -> Option:
    kw.setdefault("why", NO_DRAFTER)
    kw.setdefault("section", "speculative")
    return not_applicable(spellings, f"spec_{dest}", help, **kw)


def _default(spellings: tuple[str, ...], dest: str, help: str, domain: Any,
             metavar: str, default: Any, text: str, **kw: Any) -> Option:
    """A draft tuning knob whose upstream default is its only inert value."""
    return _spec(spellings, dest, help, value=domain, metavar=metavar, default=default,
                 default_text=text, inert=equals(default), accepts=str(default),
                 **kw)


def _ngram(spelling: str, dest: str, help: str, default: int | None) -> Option:
    """N-gram drafter tuning: inert whatever the value, as no n-gram drafter
    can be selected (--spec-type refuses every ngram-* type)."""
    return _spec((spelling,), dest, help, value=Int(), metavar="N", default=default,
                 inert=ALWAYS, accepts="any value (no n-gram drafter can be selected)")


def _spec_type_inert(value: tuple[str, ...]) -> bool:
    return all(item == "none" for item in value)


# -ctkd / -ctvd name a draft model's KV types; no draft model loads, so any
# of upstream's types is accepted and has nothing to store
NO_DRAFT_CACHE = "any KV cache type (no draft model is loaded, so it has no cache)"

SPECULATIVE: tuple[Option, ...] = (
    _spec(("--spec-draft-type-k", "-ctkd", "--cache-type-k-draft"), "cache_type_k",
          "KV cache type for K of the draft model", value=Choice(CACHE_TYPES),
          metavar="TYPE", default="f16", env="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K",
          inert=ALWAYS, accepts=NO_DRAFT_CACHE, section="common"),
    _spec(("--spec-draft-type-v", "-ctvd", "--cache-type-v-draft"), "cache_type_v",
          "KV cache type for V of the draft model", value=Choice(CACHE_TYPES),
          metavar="TYPE", default="f16", env="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V",
          inert=ALWAYS, accepts=NO_DRAFT_CACHE, section="common"),
    _spec(("--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft"), "hf_repo",
          "Hugging Face repo of the draft model", value=Text(),
          metavar="<user>/<model>[:quant]", env="LLAMA_ARG_SPEC_DRAFT_HF_REPO",
          default_text="unused"),
    _spec(("--spec-draft-threads", "-td", "--threads-draft"), "threads",
          "CPU threads for the draft model", value=Int(), metavar="N",
          default_text="same as --threads", why=NO_THREADPOOL, inert=at_most(0),
          accepts="0 or less"),
    _spec(("--spec-draft-threads-batch", "-tbd", "--threads-batch-draft"),
          "threads_batch", "CPU threads for the draft model's prompt processing",
          value=Int(), metavar="N", default_text="same as --threads-draft",
          why=NO_THREADPOOL, inert=at_most(0), accepts="0 or less"),
    _spec(("--spec-draft-cpu-mask", "-Cd", "--cpu-mask-draft"), "cpu_mask",
          "CPU affinity mask for the draft model", value=Text(allow_empty=True),
          metavar="M", default_text="same as --cpu-mask", why=NO_PLACEMENT,
          inert=equals(""), accepts='""'),
    _spec(("--spec-draft-cpu-range", "-Crd", "--cpu-range-draft"), "cpu_range",
          "CPU range for the draft model", value=Text(), metavar="lo-hi",
          why=NO_PLACEMENT),
    _default(("--spec-draft-cpu-strict", "--cpu-strict-draft"), "cpu_strict",
             "strict CPU placement for the draft model", Int(), "<0|1>", 0,
             "same as --cpu-strict", why=NO_PLACEMENT),
    _default(("--spec-draft-prio", "--prio-draft"), "prio",
             "thread priority for the draft model", Int(0, 3), "N", 0, "0",
             why=NO_PLACEMENT),
    _default(("--spec-draft-poll", "--poll-draft"), "poll",
             "polling while waiting for draft work", Int(0, 100), "<0|1>", 50,
             "same as --poll", why=NO_PLACEMENT),
    _spec(("--spec-draft-cpu-mask-batch", "-Cbd", "--cpu-mask-batch-draft"),
          "cpu_mask_batch", "CPU affinity mask for the draft model's prompt processing",
          value=Text(allow_empty=True), metavar="M", default_text="same as --cpu-mask",
          why=NO_PLACEMENT, inert=equals(""), accepts='""'),
    _default(("--spec-draft-cpu-strict-batch", "--cpu-strict-batch-draft"),
             "cpu_strict_batch", "strict CPU placement for draft prompt processing",
             Int(), "<0|1>", 0, "--cpu-strict-draft", why=NO_PLACEMENT),
    _default(("--spec-draft-prio-batch", "--prio-batch-draft"), "prio_batch",
             "thread priority for draft prompt processing", Int(0, 3), "N", 0, "0",
             why=NO_PLACEMENT),
    _default(("--spec-draft-poll-batch", "--poll-batch-draft"), "poll_batch",
             "polling while waiting for draft prompt work", Int(0, 100), "<0|1>", 50,
             "--poll-draft", why=NO_PLACEMENT),
    _spec(("--spec-draft-override-tensor", "-otd", "--override-tensor-draft"),
          "override_tensor", "GGML buffer types for the draft model's tensors",
          value=Text(), metavar="<tensor name pattern>=<buffer type>,..."),
    _spec(("--spec-draft-cpu-moe", "-cmoed", "--cpu-moe-draft"), "cpu_moe",
          "keep the draft model's MoE weights on the CPU", kind="flag",
          env="LLAMA_ARG_SPEC_DRAFT_CPU_MOE"),
    _spec(("--spec-draft-n-cpu-moe", "--spec-draft-ncmoe", "-ncmoed",
           "--n-cpu-moe-draft"), "n_cpu_moe",
          "keep the draft MoE weights of the first N layers on the CPU",
          value=Int(), metavar="N", env="LLAMA_ARG_SPEC_DRAFT_N_CPU_MOE",
          inert=equals(0), accepts="0"),
    _default(("--spec-draft-n-max",), "n_max", "tokens to draft per step", Int(),
             "N", 3, "3", env="LLAMA_ARG_SPEC_DRAFT_N_MAX"),
    _default(("--spec-draft-n-min",), "n_min", "fewest draft tokens to use", Int(),
             "N", 0, "0", env="LLAMA_ARG_SPEC_DRAFT_N_MIN"),
    _default(("--spec-draft-p-split", "--draft-p-split"), "p_split",
             "speculative split probability", Float(), "P", 0.1, "0.10",
             env="LLAMA_ARG_SPEC_DRAFT_P_SPLIT"),
    _default(("--spec-draft-p-min", "--draft-p-min"), "p_min",
             "lowest draft probability to keep drafting (greedy)", Float(), "P", 0.0,
             "0.00", env="LLAMA_ARG_SPEC_DRAFT_P_MIN"),
    _spec(("--spec-draft-backend-sampling",), "backend_sampling",
          "sample the draft on the backend device", kind="bool",
          negations=("--no-spec-draft-backend-sampling",), default=True,
          env="LLAMA_ARG_SPEC_DRAFT_BACKEND_SAMPLING", inert=equals(True),
          accepts="--spec-draft-backend-sampling"),
    _spec(("--spec-draft-device", "-devd", "--device-draft"), "device",
          "devices for the draft model", value=Text(), metavar="<dev1,dev2,..>"),
    _spec(("--spec-draft-ngl", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"),
          "gpu_layers", "draft model layers to offload to the GPU", value=GpuLayers(),
          metavar="N", default="auto", env="LLAMA_ARG_N_GPU_LAYERS_DRAFT",
          inert=lambda v: isinstance(v, str) or v < 0, accepts="auto or all"),
    _spec(("--spec-draft-model", "-md", "--model-draft"), "model",
          "the draft model", value=Text(), metavar="FNAME",
          env="LLAMA_ARG_SPEC_DRAFT_MODEL", default_text="unused"),
    _spec(("--spec-type",), "type", "which speculative decoders to use, comma-separated",
          value=CsvChoice(SPEC_TYPES), metavar=",".join(SPEC_TYPES), default=("none",),
          env="LLAMA_ARG_SPEC_TYPE", inert=_spec_type_inert, accepts="none"),
    _ngram("--spec-ngram-mod-n-min", "ngram_mod_n_min", "ngram-mod: fewest tokens", 48),
    _ngram("--spec-ngram-mod-n-max", "ngram_mod_n_max", "ngram-mod: most tokens", 64),
    _ngram("--spec-ngram-mod-n-match", "ngram_mod_n_match", "ngram-mod: lookup length",
           24),
    _ngram("--spec-ngram-simple-size-n", "ngram_simple_size_n",
           "ngram-simple: lookup n-gram length", 12),
    _ngram("--spec-ngram-simple-size-m", "ngram_simple_size_m",
           "ngram-simple: draft m-gram length", 48),
    _ngram("--spec-ngram-simple-min-hits", "ngram_simple_min_hits",
           "ngram-simple: fewest hits", 1),
    _ngram("--spec-ngram-map-k-size-n", "ngram_map_k_size_n",
           "ngram-map-k: lookup n-gram length", 12),
    _ngram("--spec-ngram-map-k-size-m", "ngram_map_k_size_m",
           "ngram-map-k: draft m-gram length", 48),
    _ngram("--spec-ngram-map-k-min-hits", "ngram_map_k_min_hits",
           "ngram-map-k: fewest hits", 1),
    _ngram("--spec-ngram-map-k4v-size-n", "ngram_map_k4v_size_n",
           "ngram-map-k4v: lookup n-gram length", 12),
    _ngram("--spec-ngram-map-k4v-size-m", "ngram_map_k4v_size_m",
           "ngram-map-k4v: draft m-gram length", 48),
    _ngram("--spec-ngram-map-k4v-min-hits", "ngram_map_k4v_min_hits",
           "ngram-map-k4v: fewest hits", 1),
    # Removed upstream; kept as spellings of their replacements, as the spec does.
    _spec(("--draft", "--draft-n", "--draft-max"), "draft_max",
          "old spelling of --spec-draft-n-max", value=Int(), metavar="N",
          env="LLAMA_ARG_DRAFT_MAX", inert=equals(3), accepts="3"),
    _spec(("--draft-min", "--draft-n-min"), "draft_min",
          "old spelling of --spec-draft-n-min", value=Int(), metavar="N",
          env="LLAMA_ARG_DRAFT_MIN", inert=equals(0), accepts="0"),
    _ngram("--spec-ngram-size-n", "ngram_size_n", "removed upstream (n-gram size N)",
           None),
    _ngram("--spec-ngram-size-m", "ngram_size_m", "removed upstream (n-gram size M)",
           None),
    _ngram("--spec-ngram-min-hits", "ngram_min_hits", "removed upstream (fewest hits)",
           None),
    _spec(("-lcs", "--lookup-cache-static"), "lookup_cache_static",
          "static n-gram lookup cache file", value=Text(), metavar="FNAME",
          section="server", inert=ALWAYS,
          accepts="any path (no n-gram drafter can be selected)"),
    _spec(("-lcd", "--lookup-cache-dynamic"), "lookup_cache_dynamic",
          "dynamic n-gram lookup cache file", value=Text(), metavar="FNAME",
          section="server", inert=ALWAYS,
          accepts="any path (no n-gram drafter can be selected)"),
)

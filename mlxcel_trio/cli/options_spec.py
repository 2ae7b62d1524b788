"""Speculative decoding: the draft model, the n-gram drafters, their GGML
placement, and the options upstream has already removed.

What mlxcel-trio runs (engine/speculative/) is supported: --spec-type
draft-simple with a draft checkpoint (-md), ngram-simple, ngram-map-k,
ngram-map-k4v, ngram-mod and ngram-cache (with its -lcs / -lcd lookup
files), the draft bounds (--spec-draft-n-max / -n-min / -p-min) and every
n-gram type's sizes.  The draft types that need a head MLX checkpoints do
not carry (EAGLE-3, MTP, DFlash, DSpark) are refused before the model load.  The GGML placement of the draft model stays
hidden and inert-or-refused like the target's; the removed --draft*
spellings are refused with upstream's words.
"""

from __future__ import annotations

from typing import Any

import attrs

from mlxcel_trio.cli.options_ggml import CACHE_TYPES
from mlxcel_trio.cli.record import Option
from mlxcel_trio.cli.refusals import (
    NO_PLACEMENT,
    NO_THREADPOOL,
    at_most,
    equals,
    not_applicable,
)
from mlxcel_trio.cli.values import BadValue, Choice, CsvChoice, Float, GpuLayers, Int, Text
from mlxcel_trio.protocol.speculative import IMPLEMENTED_TYPES

OWNER = 17

SPEC_TYPES = (
    "none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark",
    "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
)


HEADS = {
    "draft-eagle3": "an EAGLE-3 draft head",
    "draft-mtp": "multi-token-prediction layers",
    "draft-dflash": "a DFlash draft head",
    "draft-dspark": "a DSpark draft head",
}
INSTEAD_TYPES = ("use draft-simple with -md <draft checkpoint>, or ngram-simple, ngram-map-k, "
                 "ngram-map-k4v, ngram-mod or ngram-cache")
NOT_DRAFT = ("the draft model runs in MLX beside the target, greedily and with its "
             "KV cache in the model's own float type")


@attrs.frozen
class SpecTypes(CsvChoice):
    """--spec-type: upstream's type names, comma-separated; "none" anywhere
    turns speculation off, as upstream's parser does."""

    def parse(self, text: str) -> tuple[str, ...]:
        items = tuple(item.strip() for item in text.split(","))
        for item in items:
            if item not in self.choices:
                raise BadValue(f"unknown speculative type: {item}")
        return ("none",) if "none" in items else items


def _type_refusal(value: tuple[str, ...]) -> str | None:
    for item in value:
        if item in HEADS:
            return (f"{item} needs {HEADS[item]}, which MLX checkpoints do not carry; "
                    f"{INSTEAD_TYPES}")
        if item != "none" and item not in IMPLEMENTED_TYPES:
            return f"{item} is not implemented yet in mlxcel-trio; {INSTEAD_TYPES}"
    return None


def _spec(spellings: tuple[str, ...], dest: str, help: str, **kw: Any) -> Option:
    """A draft-placement knob with no MLX meaning (hidden; inert or refused)."""
    kw.setdefault("why", NOT_DRAFT)
    kw.setdefault("section", "speculative")
    return not_applicable(spellings, f"spec_{dest}", help, **kw)


def _default(spellings: tuple[str, ...], dest: str, help: str, domain: Any,
             metavar: str, default: Any, text: str, **kw: Any) -> Option:
    """A draft tuning knob whose upstream default is its only inert value."""
    return _spec(spellings, dest, help, value=domain, metavar=metavar, default=default,
                 default_text=text, inert=equals(default), accepts=str(default),
                 **kw)


def _on(spellings: tuple[str, ...], dest: str, help: str, **kw: Any) -> Option:
    """A speculative setting mlxcel-trio acts on."""
    return Option(spellings, f"spec_{dest}", help, section="speculative", owner=OWNER, **kw)


NGRAM_N = "ngram size N must be between 1 and 1024 inclusive"
NGRAM_M = "ngram size M must be between 1 and 1024 inclusive"
MIN_HITS = "ngram min hits must be at least 1"


def _ngram_on(kind: str, default_n: int, default_m: int) -> tuple[Option, ...]:
    key = kind.replace("-", "_")
    return (
        _on((f"--spec-{kind}-size-n",), f"{key}_size_n",
            f"{kind}: lookup n-gram length",
            value=Int(1, 1024, message=NGRAM_N), metavar="N", default=default_n),
        _on((f"--spec-{kind}-size-m",), f"{key}_size_m",
            f"{kind}: draft m-gram length",
            value=Int(1, 1024, message=NGRAM_M), metavar="N", default=default_m),
        _on((f"--spec-{kind}-min-hits",), f"{key}_min_hits",
            f"{kind}: fewest hits",
            value=Int(1, message=MIN_HITS), metavar="N", default=1),
    )


def _removed(spellings: tuple[str, ...], dest: str, help: str, instead: str,
             env: str | None = None) -> Option:
    """Removed upstream: refused with upstream's words, whatever the value."""
    return not_applicable(spellings, f"spec_{dest}", help, value=Int(), metavar="N",
                          env=env, section="speculative", owner=OWNER,
                          why="the argument has been removed", instead=instead)



SPECULATIVE: tuple[Option, ...] = (
    _spec(("--spec-draft-type-k", "-ctkd", "--cache-type-k-draft"), "cache_type_k",
          "KV cache type for K of the draft model", value=Choice(CACHE_TYPES),
          metavar="TYPE", default="f16", env="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K",
          inert=equals("f16", "bf16", "f32"), accepts="f16, bf16 or f32",
          section="common"),
    _spec(("--spec-draft-type-v", "-ctvd", "--cache-type-v-draft"), "cache_type_v",
          "KV cache type for V of the draft model", value=Choice(CACHE_TYPES),
          metavar="TYPE", default="f16", env="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V",
          inert=equals("f16", "bf16", "f32"), accepts="f16, bf16 or f32",
          section="common"),
    _spec(("--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft"), "hf_repo",
          "Hugging Face repo of the draft model", value=Text(),
          metavar="<user>/<model>[:quant]", env="LLAMA_ARG_SPEC_DRAFT_HF_REPO",
          default_text="unused", why="a draft model is named by -md",
          instead="use -md <user>/<model> (an MLX checkpoint directory or Hub repo id)"),
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
    _on(("--spec-draft-n-max",), "n_max",
        "tokens the draft model proposes per step",
        value=Int(0, message="invalid value"), metavar="N", default=3,
        env="LLAMA_ARG_SPEC_DRAFT_N_MAX"),
    _on(("--spec-draft-n-min",), "n_min",
        "fewest draft-model tokens worth verifying", value=Int(),
        metavar="N", default=0, env="LLAMA_ARG_SPEC_DRAFT_N_MIN"),
    _default(("--spec-draft-p-split", "--draft-p-split"), "p_split",
             "speculative split probability", Float(), "P", 0.1, "0.10",
             env="LLAMA_ARG_SPEC_DRAFT_P_SPLIT",
             why="mlxcel-trio drafts one sequence per row and never splits a draft tree"),
    _on(("--spec-draft-p-min", "--draft-p-min"), "p_min",
        "lowest draft probability to keep drafting (greedy)", value=Float(), metavar="P",
        default=0.0, default_text="0.00", env="LLAMA_ARG_SPEC_DRAFT_P_MIN"),
    _spec(("--spec-draft-backend-sampling",), "backend_sampling",
          "sample the draft on the backend device", kind="bool",
          negations=("--no-spec-draft-backend-sampling",), default=True,
          env="LLAMA_ARG_SPEC_DRAFT_BACKEND_SAMPLING", inert=equals(True),
          accepts="--spec-draft-backend-sampling",
          why="the draft is always sampled in the draft model's own MLX graph"),
    _spec(("--spec-draft-device", "-devd", "--device-draft"), "device",
          "devices for the draft model", value=Text(), metavar="<dev1,dev2,..>",
          why="the draft model runs on the target's MLX device"),
    _spec(("--spec-draft-ngl", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"),
          "gpu_layers", "draft model layers to offload to the GPU", value=GpuLayers(),
          metavar="N", default="auto", env="LLAMA_ARG_N_GPU_LAYERS_DRAFT",
          inert=lambda v: isinstance(v, str) or v < 0, accepts="auto or all",
          why="the draft model runs whole on the target's MLX device"),
    _on(("--spec-draft-model", "-md", "--model-draft"), "model",
        "the draft model: an MLX checkpoint sharing the target's tokenizer", value=Text(), metavar="FNAME", env="LLAMA_ARG_SPEC_DRAFT_MODEL",
        default_text="unused"),
    _on(("--spec-type",), "type",
        "which speculative decoders to use, comma-separated",
        value=SpecTypes(SPEC_TYPES), metavar=",".join(SPEC_TYPES), default=("none",),
        env="LLAMA_ARG_SPEC_TYPE", refuse=_type_refusal),
    _on(("--spec-ngram-mod-n-min",), "ngram_mod_n_min",
        "ngram-mod: fewest tokens",
        value=Int(0, 1024, message="ngram n-min must be between 0 and 1024 inclusive"),
        metavar="N", default=48),
    _on(("--spec-ngram-mod-n-max",), "ngram_mod_n_max",
        "ngram-mod: most tokens",
        value=Int(0, 1024, message="ngram n-max must be between 0 and 1024 inclusive"),
        metavar="N", default=64),
    _on(("--spec-ngram-mod-n-match",), "ngram_mod_n_match", "ngram-mod: lookup length",
        value=Int(1, 1024, message=NGRAM_N), metavar="N", default=24),
    *_ngram_on("ngram-simple", 12, 48),
    *_ngram_on("ngram-map-k", 12, 48),
    *_ngram_on("ngram-map-k4v", 12, 48),
    _removed(("--draft", "--draft-n", "--draft-max"), "draft_max",
             "the argument has been removed", "use --spec-draft-n-max or --spec-ngram-mod-n-max",
             env="LLAMA_ARG_DRAFT_MAX"),
    _removed(("--draft-min", "--draft-n-min"), "draft_min", "the argument has been removed",
             "use --spec-draft-n-min or --spec-ngram-mod-n-min", env="LLAMA_ARG_DRAFT_MIN"),
    _removed(("--spec-ngram-size-n",), "ngram_size_n", "the argument has been removed",
             "use the respective --spec-ngram-*-size-n"),
    _removed(("--spec-ngram-size-m",), "ngram_size_m", "the argument has been removed",
             "use the respective --spec-ngram-*-size-m"),
    _removed(("--spec-ngram-min-hits",), "ngram_min_hits", "the argument has been removed",
             "use the respective --spec-ngram-*-min-hits"),
    _on(("-lcs", "--lookup-cache-static"), "lookup_cache_static",
        "ngram-cache: path to a static lookup cache (llama.cpp's binary format), read once "
        "and never written", value=Text(), metavar="FNAME"),
    _on(("-lcd", "--lookup-cache-dynamic"), "lookup_cache_dynamic",
        "ngram-cache: path to a dynamic lookup cache (llama.cpp's binary format), read once; "
        "like upstream's server, generation does not write it back",
        value=Text(), metavar="FNAME"),
)

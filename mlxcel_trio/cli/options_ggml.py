"""The GGML runtime group: thread pools, CPU placement, layer offload,
device splits, GGUF loading modes, KV quantizer types, RPC.

None of it has an MLX meaning, so every option here is not_applicable and
hidden.  A value that asks for nothing, or for what MLX already does, is
inert (``--threads 0``, ``--flash-attn on``, ``--gpu-layers all``); anything
else is refused before the model is resolved.  ``--gpu-layers N`` is the one
exception to "before": only the checkpoint's layer count tells a full
offload (inert) from a partial one, so `gpu_layers_refusal` runs in main
right after the model reference resolves.
"""

from __future__ import annotations

from typing import Any

from mlxcel_trio.cli.record import Option
from mlxcel_trio.cli.refusals import (
    ALWAYS,
    NO_GGML,
    NO_THREADPOOL,
    ONE_DEVICE,
    at_most,
    equals,
    not_applicable,
)
from mlxcel_trio.cli.values import Choice, Float, GpuLayers, Int, Text

CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
LOAD_MODES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")
LOADERS = ("load_mode",)  # the deprecated loader flags yield to --load-mode

NO_PLACEMENT = "MLX has no CPU thread pool whose placement, priority or polling could be set"
NO_LOADER = "MLX reads SafeTensors weights itself; GGUF loading modes do not apply"


def _kv_type_why(value: str) -> str:
    if value in ("f32", "bf16"):
        return ("mlxcel-trio cannot choose a KV storage type: the cache stays "
                "unquantized in the model's own dtype")
    return (f"{value} is a GGML block quantizer with no MLX counterpart; the KV "
            "cache stays unquantized")


def _ggml(spellings: tuple[str, ...], dest: str, help: str, **kw: Any) -> Option:
    kw.setdefault("why", NO_GGML)
    return not_applicable(spellings, dest, help, **kw)


def _threads(spellings: tuple[str, ...], dest: str, what: str, **kw: Any) -> Option:
    return _ggml(spellings, dest, f"CPU threads for {what} (a GGML setting)",
                 value=Int(), metavar="N", why=NO_THREADPOOL, inert=at_most(0),
                 accepts="0 or less", **kw)


def _placement(spellings: tuple[str, ...], dest: str, help: str, metavar: str,
               inert: Any = None, **kw: Any) -> Option:
    """CPU masks, ranges, strictness, priority, polling: only the neutral value."""
    if metavar in ("M", "lo-hi"):
        domain: Any = Text(allow_empty=True)
    else:
        domain = kw.pop("domain", Int())
    if inert is None:
        return _ggml(spellings, dest, help, value=domain, metavar=metavar,
                     why=NO_PLACEMENT, **kw)
    accepts = '""' if inert == "" else str(inert)
    return _ggml(spellings, dest, help, value=domain, metavar=metavar,
                 why=NO_PLACEMENT, inert=equals(inert), accepts=accepts, **kw)


def gpu_layers_refusal(value: Any, layers: int | None) -> str | None:
    """The post-resolution half of --gpu-layers: N must cover every layer."""
    if isinstance(value, str) or value < 0:
        return None  # auto / all, or upstream's negative spellings of them
    if layers is None:
        return ("the checkpoint's config.json does not state its layer count, so "
                f"{value} cannot be shown to cover every layer; pass all or omit the option")
    if value >= layers:
        return None
    return (f"MLX runs all {layers} layers of this checkpoint on one device, so a "
            f"partial offload of {value} cannot be honoured; pass all (or a number "
            f">= {layers}) or omit the option")


GGML: tuple[Option, ...] = (
    _threads(("-t", "--threads"), "threads", "generation", default=-1,
             env="LLAMA_ARG_THREADS"),
    _threads(("-tb", "--threads-batch"), "threads_batch", "prompt processing",
             default_text="same as --threads"),
    _placement(("-C", "--cpu-mask"), "cpu_mask", "CPU affinity mask in hex (GGML)",
               "M", inert="", default="", default_text='""'),
    _placement(("-Cr", "--cpu-range"), "cpu_range", "CPU range for affinity (GGML)",
               "lo-hi"),
    _placement(("--cpu-strict",), "cpu_strict", "strict CPU placement (GGML)",
               "<0|1>", inert=0, default=0),
    _placement(("--prio",), "prio", "thread priority, -1 low to 3 realtime (GGML)",
               "N", inert=0, default=0, domain=Int(-1, 3)),
    _placement(("--poll",), "poll", "polling level while waiting for work (GGML)",
               "<0...100>", inert=50, default=50, domain=Int(0, 100)),
    _placement(("-Cb", "--cpu-mask-batch"), "cpu_mask_batch",
               "CPU affinity mask for prompt processing (GGML)", "M", inert="",
               default_text="same as --cpu-mask"),
    _placement(("-Crb", "--cpu-range-batch"), "cpu_range_batch",
               "CPU range for prompt processing (GGML)", "lo-hi"),
    _placement(("--cpu-strict-batch",), "cpu_strict_batch",
               "strict CPU placement for prompt processing (GGML)", "<0|1>", inert=0,
               default_text="same as --cpu-strict"),
    _placement(("--prio-batch",), "prio_batch",
               "thread priority for prompt processing (GGML)", "N", inert=0,
               default=0, domain=Int(0, 3)),
    _placement(("--poll-batch",), "poll_batch",
               "polling while waiting for prompt work (GGML)", "<0|1>", inert=50,
               default_text="same as --poll", domain=Int(0, 100)),
    _ggml(("-fa", "--flash-attn"), "flash_attn", "flash attention: on, off or auto",
          value=Choice(("on", "off", "auto")), metavar="[on|off|auto]",
          default="auto", env="LLAMA_ARG_FLASH_ATTN",
          why="MLX always uses its fused attention kernel, which cannot be switched off",
          inert=equals("on", "auto"), accepts="on or auto"),
    _ggml(("--perf",), "perf", "GGML's internal performance timers",
          kind="bool", negations=("--no-perf",), default=False, default_text="false",
          env="LLAMA_ARG_PERF",
          why="GGML's internal performance timers do not exist under MLX",
          instead="per-request timings are reported in each /completion response",
          inert=equals(False), accepts="--no-perf"),
    _ggml(("-kvo", "--kv-offload"), "kv_offload", "keep the KV cache on the device",
          kind="bool", negations=("-nkvo", "--no-kv-offload"), default=True,
          env="LLAMA_ARG_KV_OFFLOAD",
          why="the KV cache always lives in the MLX device's memory",
          inert=equals(True), accepts="--kv-offload"),
    _ggml(("--repack",), "repack", "GGML weight repacking",
          kind="bool", negations=("-nr", "--no-repack"), default=True,
          env="LLAMA_ARG_REPACK", inert=ALWAYS, accepts="either form"),
    _ggml(("--no-host",), "no_host", "bypass GGML host buffers", kind="flag",
          env="LLAMA_ARG_NO_HOST", why="GGML host buffers do not exist under MLX"),
    _ggml(("-ctk", "--cache-type-k"), "cache_type_k", "KV cache type for K",
          value=Choice(CACHE_TYPES), metavar="TYPE", default="f16",
          env="LLAMA_ARG_CACHE_TYPE_K", why=_kv_type_why, inert=equals("f16"),
          accepts="f16"),
    _ggml(("-ctv", "--cache-type-v"), "cache_type_v", "KV cache type for V",
          value=Choice(CACHE_TYPES), metavar="TYPE", default="f16",
          env="LLAMA_ARG_CACHE_TYPE_V", why=_kv_type_why, inert=equals("f16"),
          accepts="f16"),
    _ggml(("-dt", "--defrag-thold"), "defrag_thold",
          "KV defragmentation threshold (deprecated upstream, where it only warns)",
          value=Float(), metavar="N", env="LLAMA_ARG_DEFRAG_THOLD",
          inert=ALWAYS, accepts="any value"),
    _ggml(("--mlock",), "mlock", "lock the weights in RAM (deprecated upstream)",
          kind="flag", env="LLAMA_ARG_MLOCK", superseded_by=LOADERS,
          why="MLX manages the memory of the weights itself; they cannot be locked"),
    _ggml(("--mmap",), "mmap", "memory-map the weights (deprecated upstream)",
          kind="bool", negations=("--no-mmap",), env="LLAMA_ARG_MMAP",
          superseded_by=LOADERS, why=NO_LOADER, inert=equals(True), accepts="--mmap"),
    _ggml(("-dio", "--direct-io"), "direct_io", "read weights with direct I/O "
          "(deprecated upstream)", kind="bool", negations=("-ndio", "--no-direct-io"),
          env="LLAMA_ARG_DIO", superseded_by=LOADERS, why=NO_LOADER,
          inert=equals(False), accepts="--no-direct-io"),
    _ggml(("-lm", "--load-mode"), "load_mode", "how to load the weights",
          value=Choice(LOAD_MODES), metavar="MODE", default="auto",
          env="LLAMA_ARG_LOAD_MODE", why=NO_LOADER, inert=equals("auto", "mmap"),
          accepts="auto or mmap"),
    _ggml(("--numa",), "numa", "NUMA placement strategy",
          value=Choice(("distribute", "isolate", "numactl")), metavar="TYPE",
          env="LLAMA_ARG_NUMA", why="MLX does no NUMA-aware placement"),
    _ggml(("-dev", "--device"), "device", "devices to offload to",
          value=Text(), metavar="<dev1,dev2,..>", env="LLAMA_ARG_DEVICE",
          why="MLX picks its own device; there is no GGML device list to choose from"),
    _ggml(("--list-devices",), "list_devices", "print the GGML devices and exit",
          kind="flag", why="there is no GGML device list to print"),
    _ggml(("-ot", "--override-tensor"), "override_tensor",
          "place tensors in chosen GGML buffer types",
          value=Text(), metavar="<tensor name pattern>=<buffer type>,...",
          env="LLAMA_ARG_OVERRIDE_TENSOR", why="GGML buffer types do not exist under MLX"),
    _ggml(("-cmoe", "--cpu-moe"), "cpu_moe", "keep MoE expert weights on the CPU",
          kind="flag", env="LLAMA_ARG_CPU_MOE", why=ONE_DEVICE),
    _ggml(("-ncmoe", "--n-cpu-moe"), "n_cpu_moe",
          "keep the MoE weights of the first N layers on the CPU",
          value=Int(), metavar="N", env="LLAMA_ARG_N_CPU_MOE", why=ONE_DEVICE,
          inert=equals(0), accepts="0"),
    _ggml(("-ngl", "--gpu-layers", "--n-gpu-layers"), "gpu_layers",
          "how many layers to offload to the GPU",
          value=GpuLayers(), metavar="N", default="auto", env="LLAMA_ARG_N_GPU_LAYERS",
          inert=ALWAYS, accepts="auto, all, or at least the checkpoint's layer count "
          "(checked once the model reference resolves)"),
    _ggml(("-sm", "--split-mode"), "split_mode", "how to split a model across GPUs",
          value=Choice(("none", "layer", "row", "tensor")),
          metavar="{none,layer,row,tensor}", env="LLAMA_ARG_SPLIT_MODE",
          why=ONE_DEVICE, inert=equals("none"), accepts="none"),
    _ggml(("-ts", "--tensor-split"), "tensor_split", "share of the model per GPU",
          value=Text(), metavar="N0,N1,N2,...", env="LLAMA_ARG_TENSOR_SPLIT",
          why=ONE_DEVICE),
    _ggml(("-mg", "--main-gpu"), "main_gpu", "the GPU for the model or its KV cache",
          value=Int(), metavar="INDEX", default=0, env="LLAMA_ARG_MAIN_GPU",
          why=ONE_DEVICE, inert=equals(0), accepts="0"),
    _ggml(("-fit", "--fit"), "fit", "shrink unset options to fit device memory",
          value=Choice(("on", "off")), metavar="[on|off]", default="on",
          env="LLAMA_ARG_FIT", inert=equals("off"), accepts="off",
          why="there is no GGML memory fitting: the checkpoint loads as it is"),
    _ggml(("-fitt", "--fit-target"), "fit_target", "memory margin per device for --fit",
          value=Text(), metavar="MiB0,MiB1,MiB2,...", default_text="1024",
          env="LLAMA_ARG_FIT_TARGET", inert=equals("1024"), accepts="1024",
          why="there is no GGML memory fitting: the checkpoint loads as it is"),
    _ggml(("-fitc", "--fit-ctx"), "fit_ctx", "smallest context --fit may choose",
          value=Int(), metavar="N", default_text="4096", env="LLAMA_ARG_FIT_CTX",
          inert=equals(4096), accepts="4096",
          why="there is no GGML memory fitting: the checkpoint loads as it is"),
    _ggml(("--check-tensors",), "check_tensors", "validate GGUF tensor data",
          kind="flag", default_text="false",
          why="there is no GGUF tensor validation pass"),
    _ggml(("--override-kv",), "override_kv", "override GGUF metadata keys",
          value=Text(), metavar="KEY=TYPE:VALUE,...",
          why="it rewrites GGUF metadata; an MLX checkpoint's settings live in its "
          "config.json"),
    _ggml(("--op-offload",), "op_offload", "run host tensor operations on the device",
          kind="bool", negations=("--no-op-offload",), default=True, default_text="true",
          why="MLX runs every operation on its device; there is no host path to choose",
          inert=equals(True), accepts="--op-offload"),
    _ggml(("--rpc",), "rpc", "GGML RPC servers to distribute work to",
          value=Text(), metavar="SERVERS", env="LLAMA_ARG_RPC",
          why="there is no GGML RPC backend to distribute work over"),
)

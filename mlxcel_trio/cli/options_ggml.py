"""The GGML runtime group: thread pools, CPU placement, layer offload,
device splits, GGUF loading modes, KV cache types, RPC.

Nearly none of it has an MLX meaning, so those options are not_applicable
and hidden.  One rule sorts them.  An option whose only effect upstream is on
speed, memory or placement inside GGML (threads, CPU masks and priorities,
memory locking and mapping, layer offload, device splits, flash attention)
is a `tuning` option: any valid value is accepted, and one that asks for
something is named in the startup line "has no effect on MLX".  An option
that would change what the server computes or reads (GGUF metadata
overrides' unmapped keys, memory fitting, RPC) keeps its refusal.  The KV
cache types and the GGUF metadata keys with an MLX analogue
(cli/override_kv.py) are the exceptions MLX can honour: they are supported.
"""

from __future__ import annotations

from typing import Any

from mlxcel_trio.cli.override_kv import HONOURED, KvOverrideList
from mlxcel_trio.cli.record import Option
from mlxcel_trio.cli.refusals import NO_GGML, at_most, equals, not_applicable, tuning
from mlxcel_trio.cli.values import Choice, Float, GpuLayers, Int, Text
from mlxcel_trio.protocol.kv_types import KV_CACHE_TYPES

CACHE_TYPES = tuple(KV_CACHE_TYPES)  # upstream's order
LOAD_MODES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")
LOADERS = ("load_mode",)  # the deprecated loader flags yield to --load-mode



def _ggml(spellings: tuple[str, ...], dest: str, help: str, **kw: Any) -> Option:
    kw.setdefault("why", NO_GGML)
    return not_applicable(spellings, dest, help, **kw)


def _threads(spellings: tuple[str, ...], dest: str, what: str, **kw: Any) -> Option:
    return tuning(spellings, dest, f"CPU threads for {what} (a GGML setting)",
                  value=Int(), metavar="N", quiet=at_most(0), **kw)


def _placement(spellings: tuple[str, ...], dest: str, help: str, metavar: str,
               neutral: Any = None, **kw: Any) -> Option:
    """CPU masks, ranges, strictness, priority, polling: the neutral value
    is quiet, any other is reported."""
    if metavar in ("M", "lo-hi"):
        domain: Any = Text(allow_empty=True)
    else:
        domain = kw.pop("domain", Int())
    quiet = equals(neutral) if neutral is not None else equals("")
    return tuning(spellings, dest, help, value=domain, metavar=metavar, quiet=quiet, **kw)


def _gpu_layers_quiet(value: Any) -> bool:
    """auto / all and upstream's negative spellings of them ask for nothing."""
    return isinstance(value, str) or value < 0


GGML: tuple[Option, ...] = (
    _threads(("-t", "--threads"), "threads", "generation", default=-1,
             env="LLAMA_ARG_THREADS"),
    _threads(("-tb", "--threads-batch"), "threads_batch", "prompt processing",
             default_text="same as --threads"),
    _placement(("-C", "--cpu-mask"), "cpu_mask", "CPU affinity mask in hex (GGML)",
               "M", neutral="", default="", default_text='""'),
    _placement(("-Cr", "--cpu-range"), "cpu_range", "CPU range for affinity (GGML)",
               "lo-hi"),
    _placement(("--cpu-strict",), "cpu_strict", "strict CPU placement (GGML)",
               "<0|1>", neutral=0, default=0),
    _placement(("--prio",), "prio", "thread priority, -1 low to 3 realtime (GGML)",
               "N", neutral=0, default=0, domain=Int(-1, 3)),
    _placement(("--poll",), "poll", "polling level while waiting for work (GGML)",
               "<0...100>", neutral=50, default=50, domain=Int(0, 100)),
    _placement(("-Cb", "--cpu-mask-batch"), "cpu_mask_batch",
               "CPU affinity mask for prompt processing (GGML)", "M", neutral="",
               default_text="same as --cpu-mask"),
    _placement(("-Crb", "--cpu-range-batch"), "cpu_range_batch",
               "CPU range for prompt processing (GGML)", "lo-hi"),
    _placement(("--cpu-strict-batch",), "cpu_strict_batch",
               "strict CPU placement for prompt processing (GGML)", "<0|1>", neutral=0,
               default_text="same as --cpu-strict"),
    _placement(("--prio-batch",), "prio_batch",
               "thread priority for prompt processing (GGML)", "N", neutral=0,
               default=0, domain=Int(0, 3)),
    _placement(("--poll-batch",), "poll_batch",
               "polling while waiting for prompt work (GGML)", "<0|1>", neutral=50,
               default_text="same as --poll", domain=Int(0, 100)),
    tuning(("-fa", "--flash-attn"), "flash_attn", "flash attention: on, off or auto",
           value=Choice(("on", "off", "auto")), metavar="[on|off|auto]",
           default="auto", env="LLAMA_ARG_FLASH_ATTN", quiet=equals("on", "auto")),
    _ggml(("--perf",), "perf", "GGML's internal performance timers",
          kind="bool", negations=("--no-perf",), default=False, default_text="false",
          env="LLAMA_ARG_PERF",
          why="GGML's internal performance timers do not exist under MLX",
          instead="per-request timings are reported in each /completion response",
          inert=equals(False), accepts="--no-perf"),
    tuning(("-kvo", "--kv-offload"), "kv_offload", "keep the KV cache on the device",
           kind="bool", negations=("-nkvo", "--no-kv-offload"), default=True,
           env="LLAMA_ARG_KV_OFFLOAD", quiet=equals(True)),
    tuning(("--repack",), "repack", "GGML weight repacking",
           kind="bool", negations=("-nr", "--no-repack"), default=True,
           env="LLAMA_ARG_REPACK", quiet=equals(True)),
    tuning(("--no-host",), "no_host", "bypass GGML host buffers", kind="flag",
           env="LLAMA_ARG_NO_HOST"),
    # storage formats in mlxcel_trio/protocol/kv_types.py; the K/V pair is checked in cli/main.py
    Option(("-ctk", "--cache-type-k"), "cache_type_k", "KV cache data type for K",
           value=Choice(CACHE_TYPES), metavar="TYPE", default="f16",
           env="LLAMA_ARG_CACHE_TYPE_K", status="by_design", owner=3),
    Option(("-ctv", "--cache-type-v"), "cache_type_v", "KV cache data type for V",
           value=Choice(CACHE_TYPES), metavar="TYPE", default="f16",
           env="LLAMA_ARG_CACHE_TYPE_V", status="by_design", owner=3),
    tuning(("-dt", "--defrag-thold"), "defrag_thold",
           "KV defragmentation threshold (deprecated upstream, where it only warns)",
           value=Float(), metavar="N", env="LLAMA_ARG_DEFRAG_THOLD", quiet=lambda v: True),
    tuning(("--mlock",), "mlock", "lock the weights in RAM (deprecated upstream)",
           kind="flag", env="LLAMA_ARG_MLOCK", superseded_by=LOADERS),
    tuning(("--mmap",), "mmap", "memory-map the weights (deprecated upstream)",
           kind="bool", negations=("--no-mmap",), env="LLAMA_ARG_MMAP",
           superseded_by=LOADERS, quiet=equals(True)),
    tuning(("-dio", "--direct-io"), "direct_io", "read weights with direct I/O "
           "(deprecated upstream)", kind="bool", negations=("-ndio", "--no-direct-io"),
           env="LLAMA_ARG_DIO", superseded_by=LOADERS, quiet=equals(False)),
    tuning(("-lm", "--load-mode"), "load_mode", "how to load the weights",
           value=Choice(LOAD_MODES), metavar="MODE", default="auto",
           env="LLAMA_ARG_LOAD_MODE", quiet=equals("auto", "mmap")),
    tuning(("--numa",), "numa", "NUMA placement strategy",
           value=Choice(("distribute", "isolate", "numactl")), metavar="TYPE",
           env="LLAMA_ARG_NUMA"),
    tuning(("-dev", "--device"), "device", "devices to offload to",
           value=Text(), metavar="<dev1,dev2,..>", env="LLAMA_ARG_DEVICE",
           quiet=equals("none")),
    Option(("--list-devices",), "list_devices", "print the MLX devices and exit",
           kind="action", status="by_design", owner=3),
    tuning(("-ot", "--override-tensor"), "override_tensor",
           "place tensors in chosen GGML buffer types",
           value=Text(), metavar="<tensor name pattern>=<buffer type>,...",
           env="LLAMA_ARG_OVERRIDE_TENSOR"),
    tuning(("-cmoe", "--cpu-moe"), "cpu_moe", "keep MoE expert weights on the CPU",
           kind="flag", env="LLAMA_ARG_CPU_MOE"),
    tuning(("-ncmoe", "--n-cpu-moe"), "n_cpu_moe",
           "keep the MoE weights of the first N layers on the CPU",
           value=Int(), metavar="N", env="LLAMA_ARG_N_CPU_MOE", quiet=equals(0)),
    tuning(("-ngl", "--gpu-layers", "--n-gpu-layers"), "gpu_layers",
           "how many layers to offload to the GPU",
           value=GpuLayers(), metavar="N", default="auto", env="LLAMA_ARG_N_GPU_LAYERS",
           quiet=_gpu_layers_quiet),
    # the one device split MLX can honour: across mlx.launch's processes
    # (engine/distributed.py); in a single process it has no effect
    Option(("-sm", "--split-mode"), "split_mode",
           "how to split the model across the processes mlx.launch starts: row or tensor "
           "(tensor parallel), layer (pipeline), none (one process); default: tensor parallel "
           "where the architecture has it, else the pipeline",
           value=Choice(("none", "layer", "row", "tensor")),
           metavar="{none,layer,row,tensor}", env="LLAMA_ARG_SPLIT_MODE", owner=21),
    tuning(("-ts", "--tensor-split"), "tensor_split", "share of the model per GPU",
           value=Text(), metavar="N0,N1,N2,...", env="LLAMA_ARG_TENSOR_SPLIT"),
    tuning(("-mg", "--main-gpu"), "main_gpu", "the GPU for the model or its KV cache",
           value=Int(), metavar="INDEX", default=0, env="LLAMA_ARG_MAIN_GPU",
           quiet=equals(0)),
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
    Option(("--override-kv",), "override_kv",
           "override model metadata by key, where an MLX checkpoint has an analogue "
           f"(comma-separated, repeatable; types: int, float, bool, str; keys: {HONOURED})",
           value=KvOverrideList(), metavar="KEY=TYPE:VALUE,...", default=(), repeat=True,
           owner=3),
    tuning(("--op-offload",), "op_offload", "run host tensor operations on the device",
           kind="bool", negations=("--no-op-offload",), default=True, default_text="true",
           quiet=equals(True)),
    _ggml(("--rpc",), "rpc", "GGML RPC servers to distribute work to",
          value=Text(), metavar="SERVERS", env="LLAMA_ARG_RPC",
          why="there is no GGML RPC backend to distribute work over"),
)

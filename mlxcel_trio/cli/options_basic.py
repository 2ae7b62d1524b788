"""The options mlxcel-trio acts on today: actions, the model, the server
socket, slots and batching, authentication, and the foundation's logging
switch.  (The sampling ones live in options_sampling.)"""

from __future__ import annotations

from mlxcel_trio.cli import model_ref
from mlxcel_trio.cli.record import Option
from mlxcel_trio.cli.refusals import Refuser
from mlxcel_trio.cli.options_sampling import row_default, row_domain
from mlxcel_trio.cli.values import INT32_MAX, INT32_MIN, CsvList, Int, Text

ACTIONS: tuple[Option, ...] = (
    Option(("-h", "--help", "--usage"), "help", "show this help and exit",
           kind="action"),
    Option(("--version",), "version", "show the version and exit", kind="action"),
    Option(("-cl", "--cache-list"), "cache_list",
           "list the MLX checkpoints in the Hugging Face cache and exit",
           kind="action", owner=3),
    Option(("--completion-bash",), "completion_bash",
           "print a bash completion script for this command and exit",
           kind="action", owner=3),
    Option(("--dump-flag-surface",), "dump_flag_surface",
           "print every option of this table as JSON and exit", kind="action",
           hidden=True, upstream=False, owner=3),
)

BASIC: tuple[Option, ...] = (
    Option(("-m", "--model"), "model",
           "the model to serve: an MLX checkpoint directory (config.json plus "
           "*.safetensors) or a Hugging Face repo id such as "
           "mlx-community/Qwen3-0.6B-bf16 (on a CPU, bf16 and quantized weights are "
           "served in float32 when faster, see --weights); GGUF files and URLs are refused",
           value=Text(), metavar="FNAME", env="LLAMA_ARG_MODEL",
           status="aliased", refuse=model_ref.refusal, router_only=True),
    Option(("-c", "--ctx-size"), "ctx_size", "context size in tokens",
           value=Int(0, INT32_MAX), metavar="N", default=0,
           default_text="0, 0 = the checkpoint's trained context",
           env="LLAMA_ARG_CTX_SIZE"),
    Option(("-n", "--predict", "--n-predict"), "sampling.n_predict",
           "how many tokens a request may generate",
           value=row_domain("n_predict"), metavar="N", default=row_default("n_predict"),
           default_text=f"{row_default('n_predict')}, -1 = until the context is full",
           env="LLAMA_ARG_N_PREDICT"),
    Option(("-b", "--batch-size"), "batch_size",
           "logical batch size: prompt tokens prefilled per step",
           value=Int(1, INT32_MAX), metavar="N", default=2048,
           env="LLAMA_ARG_BATCH", status="aliased"),
    Option(("-v", "--verbose", "--log-verbose"), "verbose",
           "log everything, at the highest verbosity", kind="flag", default=False,
           owner=7),
)

SERVER: tuple[Option, ...] = (
    Option(("--host",), "host",
           "address to listen on, or a Unix domain socket path ending in .sock",
           value=Text(), metavar="HOST", default="127.0.0.1",
           env="LLAMA_ARG_HOST", section="server", router_only=True),
    Option(("--port",), "port", "TCP port to listen on",
           value=Int(0, 65535), metavar="PORT", default=8080,
           env="LLAMA_ARG_PORT", section="server", router_only=True),
    Option(("-np", "--parallel"), "n_parallel",
           "number of server slots (sequences decoded together)",
           value=Int(INT32_MIN, INT32_MAX), metavar="N", default=-1,
           default_text="-1, -1 = auto (4 slots)", env="LLAMA_ARG_N_PARALLEL",
           section="server", owner=8,
           refuse=Refuser(lambda v: v != 0, "invalid value for n_parallel (0 slots "
                          "serve nothing)", "pass a slot count, or -1 for auto (4)")),
    Option(("-a", "--alias"), "aliases",
           "model names to serve under, comma-separated; the first in sorted "
           "order is the one reported",
           value=CsvList(), metavar="STRING", default=(),
           env="LLAMA_ARG_ALIAS", section="server", status="aliased", router_only=True),
    Option(("--api-key",), "api_keys",
           "API keys clients must present, comma-separated",
           value=CsvList(), metavar="KEY", default=(), default_text="none",
           env="LLAMA_API_KEY", section="server", secret=True, owner=7),
    Option(("--warmup",), "warmup",
           "run one short generation before accepting requests",
           kind="bool", negations=("--no-warmup",), default=True,
           section="server"),
    Option(("-to", "--timeout"), "timeout",
           "HTTP read/write timeout in seconds (also bounds reading a whole request body)",
           value=Int(1, INT32_MAX), metavar="N", default=3600,
           env="LLAMA_ARG_TIMEOUT", section="server", owner=7, status="by_design"),
    Option(("--sse-ping-interval",), "sse_ping_interval",
           "seconds between keep-alive pings on an idle event stream",
           value=Int(), metavar="N", default=row_default("sse_ping_interval"),
           default_text=f"{row_default('sse_ping_interval')}, 0 or less = disabled",
           env="LLAMA_ARG_SSE_PING_INTERVAL", section="server", owner=6),
)

"""The option table: the one place a command-line option is described.

`OPTIONS` is every llama-server option (all of upstream's help entries plus
--rpc) and mlxcel-trio's own hidden --dump-flag-surface, each an `Option`
record (see record.py).  The records live in area modules, concatenated
here; the argparse builder, --help, --completion-bash, --dump-flag-surface,
the environment binding and the startup refusals all read this tuple.

Adding an upstream option means adding one record to its area module,
whatever its classification:

    options_basic     actions, the model, socket, slots, auth (acted on)
    options_sampling  the sampler chain and grammar
    options_model     model sources, LoRA, control vectors, multimodal
    options_ggml      the GGML runtime group (not applicable)
    options_context   context, batching, prompt cache, RoPE
    options_chat      chat templates and reasoning, endpoint modes
    options_server    transport/auth/logging, endpoints/slots/router
    options_spec      speculative decoding (not applicable)
    options_ui        web UI, tools, MCP, presets, --log-prompts-dir
    options_runtime   mlxcel-trio's own runtime choices (--blas)
"""

from __future__ import annotations

from mlxcel_trio.cli.options_basic import ACTIONS, BASIC, SERVER
from mlxcel_trio.cli.options_chat import CHAT, ROUTES
from mlxcel_trio.cli.options_context import CONTEXT, ROPE
from mlxcel_trio.cli.options_ggml import GGML
from mlxcel_trio.cli.options_model import ADAPTERS, MULTIMODAL, SOURCE
from mlxcel_trio.cli.options_runtime import RUNTIME
from mlxcel_trio.cli.options_sampling import ACTED_ON, LATER
from mlxcel_trio.cli.options_server import ENDPOINTS, LOGGING, TRANSPORT
from mlxcel_trio.cli.options_spec import SPECULATIVE
from mlxcel_trio.cli.options_ui import MISC, UI
from mlxcel_trio.cli.record import OWNERS, SECTIONS, Kind, Option, Status, check_table

__all__ = ["OPTIONS", "OWNERS", "SECTIONS", "Kind", "Option", "Status", "check_table"]

OPTIONS: tuple[Option, ...] = (
    *ACTIONS,
    *BASIC,
    *SOURCE,
    *GGML,
    *ROPE,
    *LOGGING,
    *ADAPTERS,
    *ACTED_ON,
    *LATER,
    *SPECULATIVE,
    *SERVER,
    *CONTEXT,
    *MULTIMODAL,
    *TRANSPORT,
    *ENDPOINTS,
    *CHAT,
    *ROUTES,
    *UI,
    *MISC,
    *RUNTIME,
)

check_table(OPTIONS)

BY_DEST: dict[str, Option] = {opt.dest: opt for opt in OPTIONS}

"""The option table: the one place a command-line option is described.

`OPTIONS` is read by the argparse builder (`parser.py`), `--help`,
`--dump-flag-surface`, the environment binding and the startup refusals;
nothing else lists options.  Adding an upstream option means adding one
`Option` record here, whatever its classification:

* ``kind="value"``   takes one argument, parsed by its `value` domain; its env
  variable (if any) is passed through the same domain.
* ``kind="flag"``    value-less; its env variable fires it only for upstream's
  truthy spellings (see `values.is_truthy`).
* ``kind="bool"``    a ``--x/--no-x`` pair: `spellings` set True, `negations`
  set False; its env variable is read with `values.parse_bool`, and the
  implicit ``LLAMA_ARG_NO_<NAME>`` alias means False.
* ``kind="action"``  print something and exit (help, version, surface dump).

`status` records the compatibility classification the manifest will carry;
`refuse` is the hook for an option whose given value cannot be honoured: it
gets the parsed value and returns why (plus what to use instead), or None
when that value is fine (an inert value, say).  It never runs for a default.

`dest` is the dotted path of the `ServerConfig` field the value lands in
(``"sampling.top_k"``), or an action name for ``kind="action"``.
"""

from __future__ import annotations

from typing import Any, Callable, Literal

import attrs

from mlxcel_trio.cli import model_ref
from mlxcel_trio.cli.values import (
    INT32_MAX,
    CsvList,
    Domain,
    Float,
    Int,
    Seed,
    Text,
)
from mlxcel_trio.config import RANDOM_SEED

Kind = Literal["value", "flag", "bool", "action"]
Status = Literal["supported", "aliased", "deferred", "not_applicable", "by_design"]

SECTIONS: dict[str, str] = {
    "common": "common options",
    "sampling": "sampling options",
    "server": "server options",
}


def _check_spellings(inst: Option, attr: attrs.Attribute, value: tuple[str, ...]) -> None:
    for spelling in value:
        if not spelling.startswith("-") or spelling in ("-", "--"):
            raise ValueError(f"{inst.dest}: bad spelling {spelling!r}")


@attrs.frozen
class Option:
    """One command-line option, as an operator sees it and as we honour it."""

    spellings: tuple[str, ...] = attrs.field(validator=_check_spellings)
    """Upstream's exact spellings, shortest first; for a bool pair, the
    spellings that mean True."""
    dest: str
    help: str
    kind: Kind = "value"
    value: Domain | None = None
    """Required exactly when kind == "value"."""
    metavar: str | None = None
    default: Any = None
    """The typed value used when neither argv nor the environment gives one."""
    default_text: str | None = None
    """How --help shows the default; None derives it from `default`."""
    env: str | None = None
    negations: tuple[str, ...] = attrs.field(default=(), validator=_check_spellings)
    section: str = "common"
    hidden: bool = False
    secret: bool = False
    """Never echo the value (API keys): diagnostics print <redacted>."""
    status: Status = "supported"
    refuse: Callable[[Any], str | None] | None = None
    upstream: bool = True
    """False for mlxcel-trio's own options (not in llama-server)."""

    def __attrs_post_init__(self) -> None:
        if (self.kind == "value") != (self.value is not None):
            raise ValueError(f"{self.dest}: a value domain goes with kind='value' only")
        if self.negations and self.kind != "bool":
            raise ValueError(f"{self.dest}: negations go with kind='bool' only")
        if self.section not in SECTIONS:
            raise ValueError(f"{self.dest}: unknown section {self.section!r}")

    @property
    def takes_value(self) -> bool:
        return self.kind == "value"

    @property
    def all_spellings(self) -> tuple[str, ...]:
        return self.spellings + self.negations

    @property
    def name(self) -> str:
        """The spelling diagnostics use: the first long one."""
        longs = [s for s in self.spellings if s.startswith("--")]
        return longs[0] if longs else self.spellings[0]

    @property
    def env_negated(self) -> str | None:
        """Upstream's implicit LLAMA_ARG_NO_<NAME> alias of a bool pair."""
        if self.kind == "bool" and self.negations and self.env:
            if self.env.startswith("LLAMA_ARG_"):
                return "LLAMA_ARG_NO_" + self.env[len("LLAMA_ARG_"):]
        return None

    def shown_default(self) -> str | None:
        if self.default_text is not None:
            return self.default_text
        if self.kind == "bool":
            return "enabled" if self.default else "disabled"
        if self.kind != "value" or self.default is None:
            return None
        if isinstance(self.default, tuple):
            return ",".join(self.default) or None
        return str(self.default)


def check_table(table: tuple[Option, ...]) -> None:
    """Refuse a table where two options share a spelling, dest or variable."""
    seen: dict[str, str] = {}
    for opt in table:
        keys = [*opt.all_spellings, f"dest:{opt.dest}"]
        keys += [f"env:{e}" for e in (opt.env, opt.env_negated) if e]
        for key in keys:
            if key in seen:
                raise ValueError(f"{key} is used by both {seen[key]} and {opt.name}")
            seen[key] = opt.name


OPTIONS: tuple[Option, ...] = (
    # ---- common ----
    Option(("-h", "--help", "--usage"), "help", "show this help and exit",
           kind="action"),
    Option(("--version",), "version", "show the version and exit", kind="action"),
    Option(("--dump-flag-surface",), "dump_flag_surface",
           "print every option of this table as JSON and exit", kind="action",
           hidden=True, upstream=False),
    Option(("-m", "--model"), "model",
           "the model to serve: an MLX checkpoint directory (config.json plus "
           "*.safetensors) or a Hugging Face repo id such as "
           "mlx-community/Qwen3-0.6B-bf16; GGUF files and URLs are refused",
           value=Text(), metavar="FNAME", env="LLAMA_ARG_MODEL",
           status="aliased", refuse=model_ref.refusal),
    Option(("-c", "--ctx-size"), "ctx_size", "context size in tokens",
           value=Int(0, INT32_MAX), metavar="N", default=0,
           default_text="0, 0 = the checkpoint's trained context",
           env="LLAMA_ARG_CTX_SIZE"),
    Option(("-n", "--predict", "--n-predict"), "sampling.n_predict",
           "how many tokens a request may generate",
           value=Int(-1, INT32_MAX), metavar="N", default=-1,
           default_text="-1, -1 = until the context is full",
           env="LLAMA_ARG_N_PREDICT"),
    Option(("-b", "--batch-size"), "batch_size",
           "logical batch size: prompt tokens prefilled per step",
           value=Int(1, INT32_MAX), metavar="N", default=2048,
           env="LLAMA_ARG_BATCH", status="aliased"),
    Option(("-v", "--verbose", "--log-verbose"), "verbose",
           "log everything, at the highest verbosity", kind="flag", default=False),
    # ---- sampling ----
    Option(("-s", "--seed"), "sampling.seed", "default random seed for sampling",
           value=Seed(), metavar="SEED", default=RANDOM_SEED,
           default_text="-1, -1 = a random seed", section="sampling"),
    Option(("--temp", "--temperature"), "sampling.temperature",
           "sampling temperature (0 or less = greedy)",
           value=Float(), metavar="N", section="sampling", status="by_design",
           default_text="from the checkpoint's generation_config.json, else 0.80"),
    Option(("--top-k",), "sampling.top_k", "top-k sampling (0 = disabled)",
           value=Int(), metavar="N", env="LLAMA_ARG_TOP_K", section="sampling",
           status="by_design",
           default_text="from the checkpoint's generation_config.json, else 40"),
    Option(("--top-p",), "sampling.top_p", "top-p sampling (1.0 = disabled)",
           value=Float(), metavar="N", section="sampling", status="by_design",
           default_text="from the checkpoint's generation_config.json, else 0.95"),
    Option(("--min-p",), "sampling.min_p", "min-p sampling (0.0 = disabled)",
           value=Float(), metavar="N", default=0.05, section="sampling"),
    # ---- server ----
    Option(("--host",), "host", "address to listen on",
           value=Text(), metavar="HOST", default="127.0.0.1",
           env="LLAMA_ARG_HOST", section="server"),
    Option(("--port",), "port", "TCP port to listen on",
           value=Int(0, 65535), metavar="PORT", default=8080,
           env="LLAMA_ARG_PORT", section="server"),
    Option(("-np", "--parallel"), "n_parallel",
           "number of server slots (sequences decoded together)",
           value=Int(1, INT32_MAX, sentinels=(-1,)), metavar="N", default=-1,
           default_text="-1, -1 = auto (4 slots)", env="LLAMA_ARG_N_PARALLEL",
           section="server"),
    Option(("-a", "--alias"), "aliases",
           "model names to serve under, comma-separated; the first in sorted "
           "order is the one reported",
           value=CsvList(), metavar="STRING", default=(),
           env="LLAMA_ARG_ALIAS", section="server", status="aliased"),
    Option(("--api-key",), "api_keys",
           "API keys clients must present, comma-separated",
           value=CsvList(), metavar="KEY", default=(), default_text="none",
           env="LLAMA_API_KEY", section="server", secret=True),
    Option(("--warmup",), "warmup",
           "run one short generation before accepting requests",
           kind="bool", negations=("--no-warmup",), default=True,
           section="server"),
    Option(("-to", "--timeout"), "timeout", "HTTP read/write timeout in seconds",
           value=Int(1, INT32_MAX), metavar="N", default=3600,
           env="LLAMA_ARG_TIMEOUT", section="server"),
    Option(("--sse-ping-interval",), "sse_ping_interval",
           "seconds between keep-alive pings on an idle event stream",
           value=Int(), metavar="N", default=30,
           default_text="30, 0 or less = disabled",
           env="LLAMA_ARG_SSE_PING_INTERVAL", section="server"),
)

check_table(OPTIONS)

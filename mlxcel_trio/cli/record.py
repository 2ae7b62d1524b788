"""The `Option` record: one command-line option, as an operator sees it and
as mlxcel-trio honours it.

Every option of the table (`options.OPTIONS`, assembled from the
``options_*`` area modules) is one of these.  The record is read by the
argparse builder, --help, --completion-bash, --dump-flag-surface, the
environment binding and the startup refusals; nothing else lists options.

* ``kind="value"``   takes `nargs` arguments, parsed by its `value` domain;
  its env variable (if any) is passed through the same domain.
* ``kind="flag"``    value-less; its env variable fires it only for upstream's
  truthy spellings (see `values.is_truthy`).
* ``kind="bool"``    a ``--x/--no-x`` pair: `spellings` set True, `negations`
  set False; its env variable is read with `values.parse_bool`, and the
  implicit ``LLAMA_ARG_NO_<NAME>`` alias means False.
* ``kind="action"``  print something and exit (help, version, ...).

`status` is the compatibility classification the manifest carries and
`owner` the issue that owns the option's behaviour.  `refuse` is the hook
for a value that cannot be honoured: it gets the typed value and returns
why plus what to use instead, or None when the value is fine (an inert one).
It never runs for a default.  A `refusals.Refuser` hook also says in words
which values it accepts (`accepts`).
"""

from __future__ import annotations

from typing import Any, Callable, Literal

import attrs

from mlxcel_trio.cli.values import Domain

Kind = Literal["value", "flag", "bool", "action"]
Status = Literal["supported", "aliased", "deferred", "not_applicable", "by_design"]

SECTIONS: dict[str, str] = {
    "common": "common options",
    "sampling": "sampling options",
    "speculative": "speculative decoding options",
    "server": "server options",
    "multimodal": "multimodal options",
}

# Our issues (the manifest's owner sets hold these numbers).
OWNERS: dict[int, str] = {
    2: "foundation: engine, native routes",
    3: "llama-server compatibility boundary",
    4: "chat: templates, reasoning, tools",
    5: "sampling and grammar",
    6: "streams, slots, metrics, lifecycle",
    7: "transport, auth, logging",
    8: "prompt cache and context",
    14: "performance: BLAS, weight policy, hot path",
    15: "embeddings and reranking",
    16: "LoRA adapters",
    17: "speculative decoding",
    18: "router mode",
    19: "images and audio",
    20: "web UI",
    21: "beyond one machine: shared session store, mx.distributed",
}


def _check_spellings(inst: Option, attr: attrs.Attribute, value: tuple[str, ...]) -> None:
    for spelling in value:
        if not spelling.startswith("-") or spelling in ("-", "--"):
            raise ValueError(f"{inst.dest}: bad spelling {spelling!r}")


@attrs.frozen
class Option:
    """One command-line option."""

    spellings: tuple[str, ...] = attrs.field(validator=_check_spellings)
    """Upstream's exact spellings, in upstream's order; for a bool pair, the
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
    """Never echo the value (API keys, tokens): diagnostics print <redacted>."""
    status: Status = "supported"
    owner: int = 2
    """The issue that owns this option's behaviour (see OWNERS)."""
    refuse: Callable[[Any], str | None] | None = None
    upstream: bool = True
    """False for mlxcel-trio's own options (not in llama-server)."""
    nargs: int = 1
    """How many arguments a value option consumes (2 for START END)."""
    repeat: bool = False
    """A value option that may be given several times (upstream appends each,
    e.g. -l/--logit-bias): the typed value is the tuple of every occurrence,
    in command-line order."""
    superseded_by: tuple[str, ...] = ()
    """Dests whose presence (argv or env) means this option is not
    classified at all (the deprecated loaders yield to --load-mode)."""
    router_only: bool = False
    """What only a router means (where it listens, which models it serves,
    its log file): left off each model's server's command line and out of
    its environment (cli/passthrough.py)."""
    quiet: Callable[[Any], bool] | None = None
    """Set for a tuning option (its only effect upstream is speed, memory or
    placement inside GGML): every valid value is accepted, and a given value
    this predicate does not call quiet is named once at startup in the line
    "has no effect on MLX: ...".  Such an option never refuses."""

    def __attrs_post_init__(self) -> None:
        if (self.kind == "value") != (self.value is not None):
            raise ValueError(f"{self.dest}: a value domain goes with kind='value' only")
        if self.negations and self.kind != "bool":
            raise ValueError(f"{self.dest}: negations go with kind='bool' only")
        if self.section not in SECTIONS:
            raise ValueError(f"{self.dest}: unknown section {self.section!r}")
        if self.owner not in OWNERS:
            raise ValueError(f"{self.dest}: unknown owner issue {self.owner}")
        if self.nargs != 1 and self.kind != "value":
            raise ValueError(f"{self.dest}: nargs goes with kind='value' only")
        if self.quiet is not None and self.refuse is not None:
            raise ValueError(f"{self.dest}: a tuning option is accepted, never refused")
        if self.repeat and (self.kind != "value" or self.nargs != 1 or self.env):
            raise ValueError(f"{self.dest}: repeat goes with a one-argument value option "
                             "without an env variable")

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
    def negation_name(self) -> str | None:
        """The first long negation (--no-x), for diagnostics about False."""
        longs = [s for s in self.negations if s.startswith("--")]
        return longs[0] if longs else (self.negations[0] if self.negations else None)

    @property
    def env_negated(self) -> str | None:
        """Upstream's implicit LLAMA_ARG_NO_<NAME> alias of a bool pair."""
        if self.kind == "bool" and self.negations and self.env:
            if self.env.startswith("LLAMA_ARG_"):
                return "LLAMA_ARG_NO_" + self.env[len("LLAMA_ARG_"):]
        return None

    @property
    def accepts(self) -> str | None:
        """In words, which given values are accepted (None: any in domain)."""
        return getattr(self.refuse, "accepts", None)

    def shown_default(self) -> str | None:
        if self.default_text is not None:
            return self.default_text
        if self.kind == "bool":
            if self.default is None:
                return None
            return "enabled" if self.default else "disabled"
        if self.kind != "value" or self.default is None:
            return None
        if isinstance(self.default, tuple):
            return ",".join(str(v) for v in self.default) or None
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

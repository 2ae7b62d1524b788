"""Sampling options: upstream's whole sampler chain, its penalties, logit
bias, -r/--reverse-prompt and -e/--escape, every one acted on.

Each value lands in `ServerConfig.sampling` (config.SamplingDefaults) and
from there in the server-wide defaults of the native request fields
(server/request/sampler_fields.server_defaults).  An option whose default is
a native request field's reads it, and the --help text showing it, from the
field's row (protocol/fields.py): `_row`.  The grammar options come
last.
"""

from __future__ import annotations

import re
from typing import Any

import attrs
import numpy as np

from mlxcel_trio.cli.record import Option
from mlxcel_trio.cli.refusals import ALWAYS, not_applicable
from mlxcel_trio.cli.values import BadValue, Float, Int, Seed, Text
from mlxcel_trio.protocol import sampler_names as names
from mlxcel_trio.protocol.fields import FIELDS_BY_NAME
from mlxcel_trio.protocol.fields import default as row_default

SAMPLING_ISSUE = 5
DEFAULT_SAMPLERS = names.DEFAULT_NAMES
DEFAULT_SEQUENCE = names.DEFAULT_LETTERS


@attrs.frozen
class PositiveFloat:
    """A finite number above 0 whose reciprocal is finite too (upstream's
    check on --repeat-penalty)."""

    domain: str = "a finite number greater than 0"

    def parse(self, text: str) -> float:
        value = Float().parse(text)
        as_float = np.float32(value)  # upstream checks the C++ float
        with np.errstate(over="ignore", divide="ignore"):
            inverse = np.float32(1.0) / as_float
        if as_float <= 0 or not np.isfinite(inverse):
            raise BadValue("must be finite and greater than 0")
        return value


_BIAS = re.compile(r"\s*([+-]?\d+)\s*([+-])(.*)", re.S)


@attrs.frozen
class LogitBias:
    """TOKEN_ID(+/-)BIAS, e.g. 15043+1 or 15043-inf."""

    domain: str = "TOKEN_ID+BIAS or TOKEN_ID-BIAS, e.g. 15043+1"

    def parse(self, text: str) -> tuple[int, float]:
        m = _BIAS.fullmatch(text)
        if not m:
            raise BadValue("invalid input format")
        try:
            bias = float(m.group(3).strip())
        except ValueError:
            raise BadValue("invalid input format") from None
        token = int(m.group(1))
        if not -(2**31) <= token < 2**31:
            raise BadValue("invalid input format")
        return token, -bias if m.group(2) == "-" else bias


def _unreadable(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            f.read()
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot read the file ({getattr(exc, 'strerror', None) or exc})"
    return None


def _bad_schema(text: str) -> str | None:
    from mlxcel_trio.grammar.compile import GrammarError, schema_grammar

    try:
        schema_grammar(text)
    except GrammarError as exc:
        return f"not a usable JSON schema: {exc}"
    return None


def _schema_refusal(value: str) -> str | None:
    why = _bad_schema(value)
    return None if why is None else f"{why}; fix the schema"


def _schema_file_refusal(value: str) -> str | None:
    why = _unreadable(value)
    if why is None:
        with open(value, encoding="utf-8") as f:
            why = _bad_schema(f.read())
    return None if why is None else f"{why}; fix the file"


def _grammar_file_refusal(value: str) -> str | None:
    why = _unreadable(value)
    return None if why is None else f"{why}; give a readable GBNF file"


for _hook, _words in ((_schema_refusal, "a JSON schema llguidance compiles"),
                      (_schema_file_refusal, "a readable file holding such a schema"),
                      (_grammar_file_refusal, "a readable file")):
    _hook.accepts = _words  # type: ignore[attr-defined]


def _order_refusal(chain):
    why = names.unsupported(chain)
    return None if why is None else f"{why}; give {DEFAULT_SAMPLERS} (or omit the option)"


def _samplers_refusal(value: str) -> str | None:
    return _order_refusal(names.from_names(value.split(";")))


def _sequence_refusal(value: str) -> str | None:
    return _order_refusal(names.from_letters(value))


_samplers_refusal.accepts = f"{DEFAULT_SAMPLERS}, optionally with adaptive_p"  # type: ignore[attr-defined]
_sequence_refusal.accepts = f"{DEFAULT_SEQUENCE}, optionally with a"  # type: ignore[attr-defined]


def _opt(spellings, dest, help, value, default, default_text=None, **kw: Any) -> Option:
    kw.setdefault("section", "sampling")
    return Option(spellings, f"sampling.{dest}", help, value=value,
                  metavar=kw.pop("metavar", "N"), default=default, default_text=default_text,
                  owner=SAMPLING_ISSUE, **kw)


def shown(value: float | int) -> str:
    """How --help prints a numeric default (upstream: floats with two decimals)."""
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _row(spellings, dest, help, value, note: str = "", field: str | None = None,
         **kw: Any) -> Option:
    """An option whose default is the native field `field` (default: `dest`)'s;
    --help shows it, then `note`."""
    default = row_default(field or dest)
    return _opt(spellings, dest, help, value, default,
                shown(default) + (f", {note}" if note else ""), **kw)


def row_domain(name: str) -> Int:
    """An integer option accepting what the field's limits accept (for the
    options whose domain upstream's CLI shares with the request field)."""
    lo, hi = FIELDS_BY_NAME[name].limits
    return Int(int(lo), int(hi))


def _checkpoint_first(name: str) -> str:
    return f"from the checkpoint's generation_config.json, else {shown(row_default(name))}"


ACTED_ON: tuple[Option, ...] = (
    Option(("-s", "--seed"), "sampling.seed", "default random seed for sampling",
           value=Seed(), metavar="SEED", default=row_default("seed"),
           default_text="-1, -1 = a random seed", section="sampling", owner=5),
    Option(("--temp", "--temperature"), "sampling.temperature",
           "sampling temperature (0 or less = greedy)",
           value=Float(), metavar="N", section="sampling", status="by_design", owner=5,
           default_text=_checkpoint_first("temperature")),
    Option(("--top-k",), "sampling.top_k", "top-k sampling (0 = disabled)",
           value=Int(), metavar="N", env="LLAMA_ARG_TOP_K", section="sampling",
           status="by_design", owner=5,
           default_text=_checkpoint_first("top_k")),
    Option(("--top-p",), "sampling.top_p", "top-p sampling (1.0 = disabled)",
           value=Float(), metavar="N", section="sampling", status="by_design", owner=5,
           default_text=_checkpoint_first("top_p")),
    Option(("--min-p",), "sampling.min_p", "min-p sampling (0.0 = disabled)",
           value=Float(), metavar="N", default=row_default("min_p"), section="sampling", owner=5),
)


LATER: tuple[Option, ...] = (
    _opt(("--samplers",), "samplers",
         "the sampler chain, in order, separated by ';' (upstream's default order is "
         "served, optionally with adaptive_p)", Text(), DEFAULT_SAMPLERS, metavar="SAMPLERS",
         status="by_design", refuse=_samplers_refusal),
    _opt(("--sampler-seq", "--sampling-seq"), "sampler_seq",
         "the sampler chain as one letter per stage", Text(), DEFAULT_SEQUENCE,
         metavar="SEQUENCE", status="by_design", refuse=_sequence_refusal),
    Option(("--ignore-eos",), "sampling.ignore_eos",
           "keep generating past the end-of-sequence token (bans every end-of-generation "
           "token, as --logit-bias EOS-inf)", kind="flag", default=row_default("ignore_eos"),
           section="sampling",
           owner=SAMPLING_ISSUE),
    _row(("--top-nsigma", "--top-n-sigma"), "top_n_sigma", "top-n-sigma sampling", Float(),
         "-1.0 = disabled"),
    _row(("--xtc-probability",), "xtc_probability", "XTC sampling probability", Float(),
         "0.0 = disabled"),
    _row(("--xtc-threshold",), "xtc_threshold", "XTC sampling threshold", Float(),
         "1.0 = disabled"),
    _row(("--typical", "--typical-p"), "typical_p", "locally typical sampling p", Float(),
         "1.0 = disabled"),
    _row(("--repeat-last-n",), "repeat_last_n",
         "how many recent tokens the repetition penalties look at", row_domain("repeat_last_n"),
         "0 = disabled"),
    _row(("--repeat-penalty",), "repeat_penalty", "repetition penalty", PositiveFloat(),
         "1.0 = disabled"),
    _row(("--presence-penalty",), "presence_penalty", "presence penalty", Float(),
         "0.0 = disabled"),
    _row(("--frequency-penalty",), "frequency_penalty", "frequency penalty", Float(),
         "0.0 = disabled"),
    _row(("--dry-multiplier",), "dry_multiplier", "DRY penalty multiplier", Float(),
         "0.0 = disabled"),
    _row(("--dry-base",), "dry_base", "DRY penalty base (a value below 1.0 is ignored)",
         Float()),
    _row(("--dry-allowed-length",), "dry_allowed_length",
         "repeat length DRY tolerates before penalising", Int()),
    _row(("--dry-penalty-last-n",), "dry_penalty_last_n",
         "how many recent tokens DRY looks at", row_domain("dry_penalty_last_n"), "0 = disable"),
    _opt(("--dry-sequence-breaker",), "dry_sequence_breakers",
         "a string that resets DRY matching; repeatable, replaces the default set "
         "('\\n', ':', '\"', '*'); none = no breakers", Text(allow_empty=True), None,
         metavar="STRING", repeat=True),
    _row(("--adaptive-target",), "adaptive_target",
         "adaptive-p target probability (negative = disabled)", Float()),
    _row(("--adaptive-decay",), "adaptive_decay", "adaptive-p decay rate", Float()),
    _row(("--dynatemp-range",), "dynatemp_range", "dynamic temperature range", Float(),
         "0.0 = disabled"),
    _row(("--dynatemp-exp",), "dynatemp_exp", "dynamic temperature exponent", Float(),
         field="dynatemp_exponent"),
    _row(("--mirostat",), "mirostat", "Mirostat version (replaces the sampler chain)",
         row_domain("mirostat"), "0 = disabled, 1 = Mirostat, 2 = Mirostat 2.0"),
    _row(("--mirostat-lr",), "mirostat_eta", "Mirostat learning rate (eta)", Float()),
    _row(("--mirostat-ent",), "mirostat_tau", "Mirostat target entropy (tau)", Float()),
    _opt(("-l", "--logit-bias"), "logit_bias",
         "raise or lower one token's logit, e.g. 15043+1 or 15043-inf; repeatable",
         LogitBias(), (), metavar="TOKEN_ID(+/-)BIAS", repeat=True),
    Option(("-e", "--escape"), "sampling.escape",
           "turn \\n, \\r, \\t, \\', \\\", \\\\ and \\xNN in -r and --dry-sequence-breaker "
           "values into characters", kind="bool", negations=("--no-escape",), default=True,
           default_text="true", owner=SAMPLING_ISSUE),
    Option(("-r", "--reverse-prompt"), "sampling.reverse_prompt",
           "a server-wide stop string, used when a request gives none; repeatable",
           value=Text(allow_empty=True), metavar="PROMPT", default=(), section="server",
           owner=SAMPLING_ISSUE, repeat=True),
    Option(("--grammar",), "sampling.grammar",
           "a GBNF grammar every completion must follow (a broken one is logged at startup "
           "and refused per request)", value=Text(), metavar="GRAMMAR", section="sampling",
           status="by_design", owner=SAMPLING_ISSUE),
    Option(("--grammar-file",), "sampling.grammar_file",
           "read the GBNF grammar from a file (an unreadable file stops startup)",
           value=Text(), metavar="FNAME", section="sampling", status="by_design",
           owner=SAMPLING_ISSUE, refuse=_grammar_file_refusal),
    Option(("-j", "--json-schema"), "sampling.json_schema",
           "a JSON schema every completion must follow, e.g. {} for any JSON value (a "
           "malformed one stops startup)", value=Text(), metavar="SCHEMA", section="sampling",
           status="by_design", owner=SAMPLING_ISSUE, refuse=_schema_refusal),
    Option(("-jf", "--json-schema-file"), "sampling.json_schema_file",
           "read the JSON schema from a file (unreadable or malformed stops startup)",
           value=Text(), metavar="FILE", section="sampling", status="by_design",
           owner=SAMPLING_ISSUE, refuse=_schema_file_refusal),
    not_applicable(("-bs", "--backend-sampling"), "backend_sampling",
                   "run the sampler on the backend device", kind="flag",
                   env="LLAMA_ARG_BACKEND_SAMPLING", default_text="disabled",
                   section="sampling", why="", inert=ALWAYS,
                   accepts="the flag (MLX samples on its device already)"),
)

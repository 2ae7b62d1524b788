"""Sampling options: the five mlxcel-trio acts on, and the rest of
upstream's sampler chain, penalties and grammar constraints, deferred to
issue #5 (each accepts only the value that leaves its stage disabled)."""

from __future__ import annotations

from typing import Any

from mlxcel_trio.cli.record import Option
from mlxcel_trio.cli.refusals import ALWAYS, deferred, not_applicable
from mlxcel_trio.config import RANDOM_SEED
from mlxcel_trio.cli.values import INT32_MAX, Float, Int, Seed, Text

SAMPLING_ISSUE = 5
DEFAULT_SAMPLERS = "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature"

ACTED_ON: tuple[Option, ...] = (
    Option(("-s", "--seed"), "sampling.seed", "default random seed for sampling",
           value=Seed(), metavar="SEED", default=RANDOM_SEED,
           default_text="-1, -1 = a random seed", section="sampling", owner=5),
    Option(("--temp", "--temperature"), "sampling.temperature",
           "sampling temperature (0 or less = greedy)",
           value=Float(), metavar="N", section="sampling", status="by_design", owner=5,
           default_text="from the checkpoint's generation_config.json, else 0.80"),
    Option(("--top-k",), "sampling.top_k", "top-k sampling (0 = disabled)",
           value=Int(), metavar="N", env="LLAMA_ARG_TOP_K", section="sampling",
           status="by_design", owner=5,
           default_text="from the checkpoint's generation_config.json, else 40"),
    Option(("--top-p",), "sampling.top_p", "top-p sampling (1.0 = disabled)",
           value=Float(), metavar="N", section="sampling", status="by_design", owner=5,
           default_text="from the checkpoint's generation_config.json, else 0.95"),
    Option(("--min-p",), "sampling.min_p", "min-p sampling (0.0 = disabled)",
           value=Float(), metavar="N", default=0.05, section="sampling", owner=5),
)


def _later(spellings: tuple[str, ...], dest: str, help: str, **kw: Any) -> Option:
    kw.setdefault("section", "sampling")
    return deferred(spellings, f"sampling.{dest}", help, issue=SAMPLING_ISSUE, **kw)


def _number(spellings: tuple[str, ...], dest: str, help: str, default: float,
            default_text: str, domain: Any = None) -> Option:
    return _later(spellings, dest, help, value=domain or Float(), metavar="N",
                  default=default, default_text=default_text)


LATER: tuple[Option, ...] = (
    _later(("--samplers",), "samplers", "the sampler chain, in order, separated by ';'",
           value=Text(), metavar="SAMPLERS", default=DEFAULT_SAMPLERS),
    _later(("--sampler-seq", "--sampling-seq"), "sampler_seq",
           "the sampler chain as one letter per stage", value=Text(),
           metavar="SEQUENCE", default="edskypmxt"),
    _later(("--ignore-eos",), "ignore_eos",
           "keep generating past the end-of-sequence token", kind="flag"),
    _number(("--top-nsigma", "--top-n-sigma"), "top_n_sigma", "top-n-sigma sampling",
            -1.0, "-1.00, -1.0 = disabled"),
    _number(("--xtc-probability",), "xtc_probability", "XTC sampling probability",
            0.0, "0.00, 0.0 = disabled"),
    _number(("--xtc-threshold",), "xtc_threshold", "XTC sampling threshold",
            0.1, "0.10, 1.0 = disabled"),
    _number(("--typical", "--typical-p"), "typical_p", "locally typical sampling p",
            1.0, "1.00, 1.0 = disabled"),
    _number(("--repeat-last-n",), "repeat_last_n",
            "how many recent tokens the repetition penalties look at", 64,
            "64, 0 = disabled", Int(-1, INT32_MAX)),
    _number(("--repeat-penalty",), "repeat_penalty", "repetition penalty",
            1.0, "1.00, 1.0 = disabled"),
    _number(("--presence-penalty",), "presence_penalty", "presence penalty",
            0.0, "0.00, 0.0 = disabled"),
    _number(("--frequency-penalty",), "frequency_penalty", "frequency penalty",
            0.0, "0.00, 0.0 = disabled"),
    _number(("--dry-multiplier",), "dry_multiplier", "DRY penalty multiplier",
            0.0, "0.00, 0.0 = disabled"),
    _number(("--dry-base",), "dry_base", "DRY penalty base", 1.75, "1.75"),
    _number(("--dry-allowed-length",), "dry_allowed_length",
            "repeat length DRY tolerates before penalising", 2, "2", Int()),
    _number(("--dry-penalty-last-n",), "dry_penalty_last_n",
            "how many recent tokens DRY looks at", 64, "64, 0 = disable",
            Int(-1, INT32_MAX)),
    _later(("--dry-sequence-breaker",), "dry_sequence_breakers",
           "a string that resets DRY matching (replaces the default set; none = no breakers)",
           value=Text(), metavar="STRING"),
    _number(("--adaptive-target",), "adaptive_target",
            "adaptive-p target probability (negative = disabled)", -1.0, "-1.00"),
    _number(("--adaptive-decay",), "adaptive_decay", "adaptive-p decay rate",
            0.9, "0.90"),
    _number(("--dynatemp-range",), "dynatemp_range", "dynamic temperature range",
            0.0, "0.00, 0.0 = disabled"),
    _number(("--dynatemp-exp",), "dynatemp_exp", "dynamic temperature exponent",
            1.0, "1.00"),
    _number(("--mirostat",), "mirostat", "Mirostat version (1 or 2)", 0,
            "0, 0 = disabled, 1 = Mirostat, 2 = Mirostat 2.0", Int(0, 2)),
    _number(("--mirostat-lr",), "mirostat_eta", "Mirostat learning rate (eta)",
            0.1, "0.10"),
    _number(("--mirostat-ent",), "mirostat_tau", "Mirostat target entropy (tau)",
            5.0, "5.00"),
    _later(("-l", "--logit-bias"), "logit_bias",
           "raise or lower one token's logit, e.g. 15043+1", value=Text(),
           metavar="TOKEN_ID(+/-)BIAS"),
    _later(("--grammar",), "grammar", "a GBNF grammar every completion must follow",
           value=Text(), metavar="GRAMMAR"),
    _later(("--grammar-file",), "grammar_file", "read the GBNF grammar from a file",
           value=Text(), metavar="FNAME"),
    _later(("-j", "--json-schema"), "json_schema",
           "a JSON schema every completion must follow", value=Text(), metavar="SCHEMA"),
    _later(("-jf", "--json-schema-file"), "json_schema_file",
           "read the JSON schema from a file", value=Text(), metavar="FILE"),
    _later(("-e", "--escape"), "escape",
           "turn \\n, \\t and similar escapes into characters in string options",
           kind="bool", negations=("--no-escape",), default=True, default_text="true",
           section="common"),
    _later(("-r", "--reverse-prompt"), "reverse_prompt",
           "a server-wide stop string", value=Text(), metavar="PROMPT", section="server"),
    not_applicable(("-bs", "--backend-sampling"), "backend_sampling",
                   "run the sampler on the backend device", kind="flag",
                   env="LLAMA_ARG_BACKEND_SAMPLING", default_text="disabled",
                   section="sampling", why="", inert=ALWAYS,
                   accepts="the flag (MLX samples on its device already)"),
)

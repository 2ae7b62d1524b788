"""generation_settings: a resolved request as upstream's task_params::to_json.

The keys follow to_json's order, which is not the schema table's (the table
keeps make_llama_cmpl_schema's order, which decides which bad field a
request is refused for), so the order is the one list here.  A key that is
a NATIVE_FIELDS row projects the record's value by its kind: a float as
nlohmann writes a C++ float (non-finite -> null), a tuple as an array, the
rest as they are.  The other keys are derived from the record, or fixed
where the request cannot change them here (the deferred chat_format /
reasoning_format / generation_prompt rows report upstream's value for
"nothing applied"); lora reports the scale vector the request runs with.
speculative.types is the server's --spec-type in force (the caller passes
it: the request cannot change it, as upstream compiles its speculative.*
fields out).  backend_sampling is left out (no analogue), as the spec
records.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ..adapters import report
from ...protocol.fields import FIELDS_BY_NAME
from .schema import NativeRequest

GENERATION_SETTINGS: tuple[str, ...] = (
    "seed", "temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p", "min_p",
    "top_n_sigma", "xtc_probability", "xtc_threshold", "typical_p", "repeat_last_n",
    "repeat_penalty", "presence_penalty", "frequency_penalty", "dry_multiplier", "dry_base",
    "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers", "mirostat",
    "mirostat_tau", "mirostat_eta", "adaptive_target", "adaptive_decay", "stop", "max_tokens",
    "n_predict", "n_keep", "n_discard", "ignore_eos", "stream", "logit_bias", "n_probs",
    "min_keep", "grammar", "grammar_lazy", "grammar_triggers", "preserved_tokens",
    "chat_format", "reasoning_format", "reasoning_in_content", "generation_prompt",
    "samplers", "speculative.types", "timings_per_token", "post_sampling_probs", "lora",
)
SPEC_TYPES = "speculative.types"

# to_json(true), the form /props and /slots report, leaves these out
REDUCED_DROPS = ("dry_sequence_breakers", "stop", "logit_bias", "grammar", "grammar_lazy",
                 "grammar_triggers", "preserved_tokens")


def json_float(x: float) -> float | None:
    """nlohmann writes a non-finite float as null."""
    return x if math.isfinite(x) else None


def logit_bias_json(rec: NativeRequest) -> list[dict]:
    return [{"bias": json_float(b), "token": t} for t, b in rec.logit_bias]


def _grammar(rec: NativeRequest) -> str:
    """The GBNF in force (a JSON schema or a tool-call grammar reports "")."""
    spec = rec.grammar_spec
    return spec.text if spec is not None and spec.kind == "gbnf" else ""


_DERIVED: dict[str, Callable[[Any], Any]] = {
    "max_tokens": lambda rec: rec.n_predict,
    "logit_bias": logit_bias_json,
    "grammar": _grammar,
    # a table row until grammar_fields.resolve replaces it with the parsed list
    "grammar_triggers": lambda rec: list(rec.grammar_triggers or ()),
    "preserved_tokens": lambda rec: list(rec.preserved_tokens or ()),
    "chat_format": lambda rec: "Content-only",
    "reasoning_format": lambda rec: "none",
    "reasoning_in_content": lambda rec: False,
    "generation_prompt": lambda rec: "",
    "lora": lambda rec: report(rec.lora or ()),
    SPEC_TYPES: lambda rec: "none",
}


def _project(key: str) -> Callable[[Any], Any]:
    if key in _DERIVED:
        return _DERIVED[key]
    field = FIELDS_BY_NAME[key]
    if field.kind == "float":
        return lambda rec: json_float(getattr(rec, field.attr))
    if field.kind in ("json", "stop"):  # tuples after resolving
        return lambda rec: list(getattr(rec, field.attr))
    return lambda rec: getattr(rec, field.attr)


_PROJECTIONS = tuple((key, _project(key)) for key in GENERATION_SETTINGS)


def generation_settings(rec: NativeRequest, spec_types: str = "none") -> dict[str, Any]:
    """task_params::to_json, each key from the value actually in force."""
    return {key: spec_types if key == SPEC_TYPES else project(rec)
            for key, project in _PROJECTIONS}


def reduced_settings(rec: NativeRequest, spec_types: str = "none") -> dict[str, Any]:
    """to_json(true): the form /props and /slots report."""
    return {key: spec_types if key == SPEC_TYPES else project(rec)
            for key, project in _PROJECTIONS if key not in REDUCED_DROPS}

"""`--dump-flag-surface`: the live option table as JSON.

This is the machine interface the compatibility manifest and its tests read,
so it prints the table itself, hidden options included, rather than anything
scraped from --help.  The output is stable: options sorted by `name` (their
first long spelling), keys sorted, two-space indent.

Per option:
  name            first long spelling (what diagnostics call it)
  spellings       every accepted spelling, negations included
  negations       the spellings that set a bool pair False
  env             [its variable, then the implicit LLAMA_ARG_NO_* alias]
  env_negated     that implicit alias alone, or null
  default         the typed value used when nothing is given (null: none)
  default_text    the default as --help shows it
  takes_value     whether it consumes arguments; nargs how many
  kind            value | flag | bool | action
  hidden          absent from --help and --completion-bash
  status          supported | aliased | deferred | not_applicable | by_design
  owner_issue     the issue that owns its behaviour (2..8)
  accepts         for a refusing option, the values it accepts, in words
  refuses         whether some given value is refused at startup
  checked_after_model  classified only once the model reference resolved
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from mlxcel_trio.cli.options import OPTIONS, Option
from mlxcel_trio.cli.refusals import ALWAYS

SCHEMA_VERSION = 1
# Options classified after the model reference resolves (see main.py).
_AFTER_MODEL = frozenset({"gpu_layers"})


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _refuses(opt: Option) -> bool:
    if opt.dest in _AFTER_MODEL:
        return True
    return opt.refuse is not None and getattr(opt.refuse, "inert", None) is not ALWAYS


def option_record(opt: Option) -> dict[str, Any]:
    """One option as a JSON-ready dict."""
    return {
        "name": opt.name,
        "spellings": list(opt.all_spellings),
        "negations": list(opt.negations),
        "dest": opt.dest,
        "kind": opt.kind,
        "takes_value": opt.takes_value,
        "nargs": opt.nargs if opt.takes_value else 0,
        "metavar": opt.metavar,
        "domain": opt.value.domain if opt.value is not None else None,
        "env": [e for e in (opt.env, opt.env_negated) if e],
        "env_negated": opt.env_negated,
        "default": _jsonable(opt.default),
        "default_text": opt.shown_default(),
        "hidden": opt.hidden,
        "section": opt.section,
        "status": opt.status,
        "owner_issue": opt.owner,
        "accepts": opt.accepts,
        "refuses": _refuses(opt),
        "checked_after_model": opt.dest in _AFTER_MODEL,
        "upstream": opt.upstream,
    }


def surface(table: Sequence[Option] = OPTIONS) -> dict[str, Any]:
    records = sorted((option_record(opt) for opt in table), key=lambda r: r["name"])
    return {"schema_version": SCHEMA_VERSION, "options": records}


def dump_flag_surface(table: Sequence[Option] = OPTIONS) -> str:
    return json.dumps(surface(table), indent=2, sort_keys=True)

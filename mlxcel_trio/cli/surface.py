"""`--dump-flag-surface`: the live option table as JSON.

This is the machine interface the compatibility manifest and its tests read,
so it prints the table itself, hidden options included, rather than anything
scraped from --help.  Defaults are the typed values ServerConfig receives
(JSON null for "not given"); `default_text` is what --help shows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from mlxcel_trio.cli.options import OPTIONS, Option


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def option_record(opt: Option) -> dict[str, Any]:
    """One option as a JSON-ready dict (stable key order)."""
    env = [e for e in (opt.env, opt.env_negated) if e]
    return {
        "spellings": list(opt.all_spellings),  # negations included, as upstream lists them
        "negations": list(opt.negations),
        "dest": opt.dest,
        "kind": opt.kind,
        "takes_value": opt.takes_value,
        "metavar": opt.metavar,
        "domain": opt.value.domain if opt.value is not None else None,
        "env": env,
        "default": _jsonable(opt.default),
        "default_text": opt.shown_default(),
        "hidden": opt.hidden,
        "section": opt.section,
        "status": opt.status,
        "refuses": opt.refuse is not None,
        "upstream": opt.upstream,
    }


def dump_flag_surface(table: Sequence[Option] = OPTIONS) -> str:
    return json.dumps(
        {"options": [option_record(opt) for opt in table]}, indent=2
    )

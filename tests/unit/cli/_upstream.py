"""Upstream's option inventory (shared/upstream/llama-server/options.json)
and plausible command lines built from it, for the inventory tests.

The reference data sits next to the repository, not in it; every test
that needs it skips cleanly when it is absent.  Nothing here is imported
by mlxcel_trio itself.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from mlxcel_trio.cli.options import OPTIONS, Option
from mlxcel_trio.cli.values import Choice, CsvChoice

REPO = Path(__file__).resolve().parents[3]
OPTIONS_JSON = REPO.parent / "shared" / "upstream" / "llama-server" / "options.json"
HAVE_UPSTREAM = OPTIONS_JSON.exists()
needs_upstream = pytest.mark.skipif(not HAVE_UPSTREAM, reason="../shared reference data absent")

BY_SPELLING: dict[str, Option] = {s: o for o in OPTIONS for s in o.all_spellings}
LIVE = ("supported", "aliased", "by_design")

# Upstream options whose plausible non-default value (see `plausible`) is
# one of the inert forms the spec lists, so it is accepted, not refused.
EXPECT_INERT = frozenset({
    "--fit", "--ubatch-size", "--defrag-thold", "--control-vector-layer-range",
    "--repack", "--mmproj-auto", "--backend-sampling", "--mmap", "--ui",
    "--threads-http",
})

# Placeholders whose value is a path: a file that exists is passed.
_PATHLIKE = re.compile(r"FNAME|FILE|PATH")
# Placeholder -> a plausible value, for placeholders that are not numbers.
_WORDS: dict[str, str] = {
    "STRING": "x", "PROMPT": "User:", "KEY": "secret", "HOST": "0.0.0.0",
    "SCHEMA": "{}", "JSON": "{}", "GRAMMAR": 'root ::= "a"',
    # the served sampler orders: upstream's default, extended with adaptive_p
    "SAMPLERS": "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature;adaptive_p",
    "SEQUENCE": "edskypmxta", "LEVEL": "high",
    "MESSAGE": "stop thinking", "FORMAT": "deepseek", "MODE": "mlock", "TYPE": "q8_0",
    "DEVICE": "none", "<dev1,dev2,..>": "Metal", "M": "ff", "lo-hi": "0-3",
    "<user>/<model>[:quant]": "owner/name", "MODEL_URL": "https://example.com/m.gguf",
    "URL": "https://example.com/mmproj.gguf", "[<repo>/]<model>[:quant]": "gemma3",
    "KEY=TYPE:VALUE,...": "llama.context_length=int:1", "<tensor name pattern>=<buffer type>,...": "exps=CPU",
    "N0,N1,N2,...": "3,1", "MiB0,MiB1,MiB2,...": "2048", "TOKEN_ID(+/-)BIAS": "15043+1",
    "SERVERS": "127.0.0.1:50052", "TOOL1,TOOL2,...": "all", "OPTION": "docker:alpine",
    "ORIGINS": "http://localhost", "METHODS": "GET", "HEADERS": "Authorization",
    "PREFIX": "/api", "TOKEN": "hf_dummy", "JINJA_TEMPLATE": "{{ messages }}",
    "START END": "0 3",
    "[on|off|auto]": "on",
}
_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?")


@cache
def upstream() -> dict[str, Any]:
    data = json.loads(OPTIONS_JSON.read_text())
    for extra in data["registered_only_with_rpc_support"]:  # --rpc
        data["options"].append({
            "spellings": extra["spellings"], "value_hint": extra["value_hint"],
            "env": [extra["env"]], "default": None, "section": "common params",
            "arg_cpp": {"args": extra["spellings"], "args_neg": []},
        })
    return data


def records() -> list[dict[str, Any]]:
    return upstream()["options"] if HAVE_UPSTREAM else []


def record_id(rec: dict[str, Any]) -> str:
    return max(rec["spellings"], key=len)


def ours(rec: dict[str, Any]) -> Option:
    return BY_SPELLING[rec["spellings"][0]]


def _number(default: str | None) -> str:
    """A plausible number different from upstream's default."""
    match = _NUMBER.match(default or "")
    if not match:
        return "4"
    text = match.group(0)
    if "." in text:
        value = float(text)
        return "0.5" if value <= 0 else f"{value / 2:g}"
    value = int(text)
    return "8" if value < 0 else ("1" if value == 0 else str(value * 2))


def plausible(rec: dict[str, Any], some_file: Path, model: Path) -> list[str]:
    """The option alone, with a plausible non-default value: for a flag the
    flag itself, for a bool pair the form opposite to its default."""
    opt = ours(rec)
    hint = rec["value_hint"]
    if opt.kind in ("flag", "action"):
        return [opt.name]
    if opt.kind == "bool":
        return [opt.negation_name if opt.default else opt.name]
    default = rec["default"]
    if opt.dest in ("model", "spec_model"):
        return [opt.name, str(model)]     # a draft sharing the target's vocabulary: itself
    if opt.dest == "spec_type":
        return [opt.name, "ngram-simple"]
    if opt.dest in ("slot_save_path", "models_dir", "media_path"):
        return [opt.name, str(some_file.parent)]  # an existing directory
    if opt.dest == "chat_template_kwargs":
        return [opt.name, '{"enable_thinking": false}']
    if opt.dest in ("cache_type_k", "cache_type_v"):
        return [opt.name, "bf16"]   # a quantized type alone would pair with the other's f16
    if isinstance(opt.value, (Choice, CsvChoice)):
        ours_default = opt.default if isinstance(opt.default, tuple) else (opt.default,)
        return [opt.name, [c for c in opt.value.choices if c not in ours_default][-1]]
    if hint in ("<0|1>",):
        return [opt.name, "1"]
    if hint == "<0...100>":
        return [opt.name, "0"]
    if hint in _WORDS:
        return [opt.name, *_WORDS[hint].split(" ")] if hint == "START END" else \
            [opt.name, _WORDS[hint]]
    if _PATHLIKE.search(hint):
        return [opt.name, f"{some_file}:0.5" if "SCALE" in hint else str(some_file)]
    if default in ("auto",):
        return [opt.name, "1"]
    return [opt.name, _number(default)]


def expect_accepted(rec: dict[str, Any]) -> bool:
    """Acted on, given an inert value, or a tuning option (accepted whatever
    its valid value, and named at startup as having no effect)."""
    opt = ours(rec)
    return opt.status in LIVE or opt.name in EXPECT_INERT or opt.quiet is not None

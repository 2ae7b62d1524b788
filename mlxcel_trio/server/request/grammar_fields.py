"""The grammar fields of a completion request, and compiling them off the
Trio thread.

Precedence is upstream's code (not its field description): the schema
branch is taken only when json_schema is present and grammar is absent;
otherwise a non-empty string grammar is the request's GBNF, and anything
else (an empty string, null, another type) leaves the server's grammar
(--grammar / --json-schema) in force.  grammar_lazy, preserved_tokens and
grammar_triggers follow upstream's handlers, including their error wording.

`resolve` and `prepare` return a new record (attrs.evolve).  `prepare`
compiles the resolved grammar with trio.to_thread (parsing, lowering and
the llguidance matcher can take up to a second for large grammars);
`make_job` falls back to compiling for a route that did not prepare, so a
grammar is never silently dropped.
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache
from typing import Any

import attrs
import trio

from ...grammar.compile import Compiler, GrammarError, GrammarSpec
from ...grammar.constraint import Triggers
from ..http.errors import ApiError, json_type_name, type_error
from .schema import NativeRequest

log = logging.getLogger("mlxcel.grammar")

TOKEN, WORD, PATTERN, PATTERN_FULL = 0, 1, 2, 3


@lru_cache(maxsize=4)
def compiler_for(vocab) -> Compiler:
    return Compiler(vocab.tokenizer_json(), vocab.n_vocab, vocab.eos_ids, vocab.piece,
                    lambda text: vocab.tokenize(text, add_special=False, parse_special=True))


def default_spec(config) -> GrammarSpec | None:
    """The server's grammar: --json-schema(-file) wins over --grammar(-file)
    when both are given (upstream keeps whichever came last on the command
    line, which argparse does not tell)."""
    s = config.sampling
    schema = s.json_schema or (_read(s.json_schema_file) if s.json_schema_file else None)
    if schema:
        return GrammarSpec("json_schema", schema)
    gbnf = s.grammar or (_read(s.grammar_file) if s.grammar_file else None)
    return GrammarSpec("gbnf", gbnf) if gbnf else None


def _read(path: str) -> str:
    """A grammar file (startup checked it was readable)."""
    with open(path, encoding="utf-8") as f:
        return f.read()


def _items(value) -> list:
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        return list(value.values())
    return [value]


def _preserved(body: dict, vocab) -> tuple[int, ...]:
    out: set[int] = set()
    if body.get("preserved_tokens") is None:
        return ()
    for t in _items(body["preserved_tokens"]):
        if not isinstance(t, str):
            raise type_error("string", t, "preserved_tokens")
        tok = vocab.single_id(t)
        if tok is not None:
            out.add(tok)
    return tuple(sorted(out))


def _trigger(t, field: str) -> dict:
    if not isinstance(t, dict):
        raise ApiError(f"Field '{field}': [json.exception.type_error.304] cannot use at() "
                       f"with {json_type_name(t)}")
    for key in ("type", "value"):
        if key not in t:
            raise ApiError(f"Field '{field}': [json.exception.out_of_range.403] key '{key}' "
                           "not found")
    kind, value = t["type"], t["value"]
    if not isinstance(kind, int) or isinstance(kind, bool):
        if not isinstance(kind, (int, float)) or isinstance(kind, bool):
            raise type_error("number", kind, field)
        kind = int(kind)
    if not isinstance(value, str):
        raise type_error("string", value, field)
    out = {"type": kind, "value": value}
    if kind == TOKEN:
        if "token" not in t:
            raise ApiError(f"Field '{field}': [json.exception.out_of_range.403] key 'token' "
                           "not found")
        tok = t["token"]
        if not isinstance(tok, (int, float)) or isinstance(tok, bool):
            raise type_error("number", tok, field)
        out["token"] = int(tok)
    elif kind not in (WORD, PATTERN, PATTERN_FULL):
        raise ApiError(f"Field '{field}': unknown grammar trigger type {kind}")
    return out


def _triggers(body: dict, lazy: bool, preserved, vocab) -> list[dict]:
    out: list[dict] = []
    if body.get("grammar_triggers") is None:
        return out
    for t in _items(body["grammar_triggers"]):
        trig = _trigger(t, "grammar_triggers")
        if trig["type"] == WORD:
            tok = vocab.single_id(trig["value"])
            if tok is not None:
                if tok not in preserved:
                    raise ApiError("Field 'grammar_triggers': Grammar trigger word should be "
                                   f"marked as preserved token: {trig['value']}")
                trig = {"type": TOKEN, "value": trig["value"], "token": tok}
        out.append(trig)
    if lazy and not out:
        raise ApiError("Field 'grammar_triggers': Error: no triggers set for lazy grammar!")
    return out


def _compiled_triggers(triggers: list[dict]) -> Triggers:
    patterns, tokens = [], []
    for t in triggers:
        kind, value = t["type"], t["value"]
        if kind == TOKEN:
            tokens.append(t["token"])
            continue
        if kind == WORD:
            pattern = re.escape(value)
        elif kind == PATTERN:
            pattern = value
        elif not value:
            pattern = "^$"
        else:
            pattern = ("" if value.startswith("^") else "^") + value + (
                "" if value.endswith("$") else "$")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ApiError(f"Failed to initialize samplers: invalid grammar trigger pattern "
                           f"'{pattern}': {exc}") from None
        patterns.append(pattern)
    return Triggers(tuple(patterns), tuple(tokens))


def _request_grammar(body: dict) -> tuple[str, str] | None:
    """(kind, text) from json_schema / grammar, or None to keep the
    server's grammar; raises for a schema that is not valid JSON."""
    if body.get("json_schema") is None and body.get("grammar") is None:
        return None
    if "json_schema" in body and "grammar" not in body:
        import json

        schema = body["json_schema"]
        return "json_schema", json.dumps(schema)
    grammar = body.get("grammar")
    if isinstance(grammar, str) and grammar:
        return "gbnf", grammar
    return None


def resolve(body: dict, rec: NativeRequest, served) -> NativeRequest:
    """The grammar in force (`grammar_spec`: a GrammarSpec or None) and the
    parsed grammar_triggers and preserved_tokens, as a new record."""
    vocab = served.bridge.vocab
    spec: GrammarSpec | None = served.defaults.grammar_spec
    chosen = _request_grammar(body)
    if chosen is not None:
        spec = GrammarSpec(*chosen)
    preserved = _preserved(body, vocab)
    triggers = _triggers(body, rec.grammar_lazy, preserved, vocab)
    if spec is not None:
        spec = GrammarSpec(spec.kind, spec.text, lazy=rec.grammar_lazy,
                           triggers=_compiled_triggers(triggers))
    # upstream converts a request's schema in the field handler: its errors
    # name the field (the spelling that was present)
    field = None
    if chosen is not None and chosen[0] == "json_schema":
        field = "json_schema" if body.get("json_schema") is not None else "grammar"
    return attrs.evolve(rec, grammar_spec=spec, grammar_field=field,
                        grammar_triggers=tuple(triggers), preserved_tokens=preserved)


def _compile(served, spec: GrammarSpec, field: str | None = None):
    try:
        return compiler_for(served.bridge.vocab).compile(spec)
    except GrammarError as exc:
        if field is not None:
            raise ApiError(f"Field '{field}': \"json_schema\": {exc}") from None
        raise ApiError(f"Failed to initialize samplers: {exc}") from None


async def prepare(served, rec: NativeRequest) -> NativeRequest:
    """The record with its grammar compiled off the Trio thread."""
    spec = rec.grammar_spec
    if spec is None or rec.grammar_compiled is not None:
        return rec
    return attrs.evolve(rec, grammar_compiled=await trio.to_thread.run_sync(
        _compile, served, spec, rec.grammar_field))


def compiled(served, rec: NativeRequest) -> Any:
    """The compiled grammar for make_job (compiled here if no await prepared
    it; the compile cache makes that cheap after the first time)."""
    spec = rec.grammar_spec
    if spec is None:
        return None
    if rec.grammar_compiled is not None:
        return rec.grammar_compiled
    return _compile(served, spec, rec.grammar_field)


def startup(config, vocab) -> None:
    """Compile the server's grammar once at startup: a broken --grammar is
    logged here and refused per request, as upstream (which only parses it
    when a request builds its sampler)."""
    spec = default_spec(config)
    if spec is None:
        return
    try:
        compiler_for(vocab).compile(spec)
    except GrammarError as exc:
        log.error("the server grammar (--grammar) cannot be used: %s; every request that "
                  "uses it will be refused", exc)

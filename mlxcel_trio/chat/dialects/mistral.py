"""Mistral: Nemo writes `[TOOL_CALLS][{"name": ..., "arguments": ..., "id": ...}]`;
Small 3.2 `[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}`, and Devstral, Magistral
and Ministral 3 `[TOOL_CALLS]NAME[ARGS]{...}` (Magistral / Ministral think in
`[THINK]...[/THINK]`)."""

from __future__ import annotations

import json

from .base import (NO_THINK, INVALID, UNDECIDED, Dialect, ToolCall, json_call, json_grammar, json_list, lark,
                   marked, read_name, schema_rule, functions)

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
THINK = ("[THINK]", "[/THINK]")


_nemo_block = json_list()


def _small_block(s: str, j: int, partial: bool, tools):
    """`NAME[CALL_ID]ID[ARGS]{...}` or `NAME[ARGS]{...}`."""
    a = s.find(ARGS, j)
    c = s.find(CALL_ID, j)
    if c >= 0 and (a < 0 or c < a):
        got = read_name(s, j, CALL_ID, partial)
        if got in (UNDECIDED, INVALID):
            return got
        name, v = got
        got = read_name(s, v, ARGS, partial)
        if got in (UNDECIDED, INVALID):
            return got
        call_id, v = got
    else:
        got = read_name(s, j, ARGS, partial, also=(CALL_ID,))
        if got in (UNDECIDED, INVALID):
            return got
        (name, v), call_id = got, ""
    got = json_call(name, s, v, "", partial)
    if got == INVALID:
        return INVALID
    call, end = got
    return [ToolCall(call.name, call.arguments, call_id, complete=call.complete)], end


def _nemo_opener(name: str | None) -> str:
    return TOOL_CALLS + '[{"name": ' + (json.dumps(name) + ', "arguments": ' if name else '"')


def _nemo_grammar(tools, name, parallel) -> str:
    rules, alts = [], []
    for i, fn in enumerate(functions(tools, name)):
        rules.append(f"a{i}: " + schema_rule(fn))
        head = "" if name else lark(fn["name"] + '", "arguments": ')
        alts.append(f"{head} a{i}".strip())
    return ("start: call " + lark("}]") + "\ncall: " + " | ".join(alts) + "\n"
            + "\n".join(rules) + "\n")


def _small_opener(name: str | None) -> str:
    return TOOL_CALLS + (name + ARGS if name else "")


NEMO = Dialect("mistral_nemo", lambda src: TOOL_CALLS + "[" in src or (
    TOOL_CALLS in src and ARGS not in src), marked("mistral_nemo", TOOL_CALLS, _nemo_block),
    opener=_nemo_opener, grammar=_nemo_grammar)
SMALL = Dialect("mistral_small", lambda src: TOOL_CALLS in src and ARGS in src,
                marked("mistral_small", TOOL_CALLS, _small_block), think=THINK, fixed_think=True,
                opener=_small_opener, grammar=json_grammar(ARGS, "", between=TOOL_CALLS))


def _small_id_opener(name: str | None) -> str:
    return TOOL_CALLS + (name + CALL_ID if name else "")


def _small_id_grammar(tools, name, parallel) -> str:
    """Small 3.2 writes a nine-character call id (its template refuses any
    other in the history): `NAME[CALL_ID]ID[ARGS]{...}`."""
    rules, alts = [], []
    for i, fn in enumerate(functions(tools, name)):
        rules.append(f"a{i}: " + schema_rule(fn))
        head = "" if name else lark(fn["name"] + CALL_ID)
        alts.append(" ".join(x for x in (head, "/[a-zA-Z0-9]{9}/", lark(ARGS), f"a{i}") if x))
    more = f" ({lark(TOOL_CALLS)} again)*" if parallel and name is None else ""
    again = [f"{lark(fn['name'] + CALL_ID)} /[a-zA-Z0-9]{{9}}/ {lark(ARGS)} a{i}"
             for i, fn in enumerate(functions(tools, name))]
    return (f"start: call{more}\ncall: " + " | ".join(alts) + "\n"
            + ("again: " + " | ".join(again) + "\n" if more else "")
            + "\n".join(rules) + "\n")


def small_variant(dialect: Dialect, src: str) -> Dialect:
    """Small 3.2's template spells [CALL_ID]: a forced call writes one.  It
    has no thinking block (upstream reads it with its autoparser, which finds
    none; Magistral, Ministral 3 and Devstral's handler reads [THINK])."""
    if dialect is not SMALL or CALL_ID not in src:
        return dialect
    import attrs
    return attrs.evolve(SMALL, opener=_small_id_opener, grammar=_small_id_grammar,
                        think=NO_THINK)

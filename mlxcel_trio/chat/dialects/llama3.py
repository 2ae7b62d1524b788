"""Llama 3.x: the answer is `{"name": ..., "parameters": ...}` (after an
optional <|python_tag|>, or after content; several separated by ';'), then
any text."""

from __future__ import annotations

import json

from ..jsonscan import Invalid, scan_call, skip_ws
from .base import Dialect, functions, hold, lark, scanned_call, schema_rule

PYTHON_TAG = "<|python_tag|>"
CALL_HEAD = '{"name"'


def detect(src: str) -> bool:
    return "<|start_header_id|>" in src and (PYTHON_TAG in src or '"parameters"' in src
                                             or "ipython" in src)


def split(rest: str, partial: bool, tools=None) -> list:
    """Calls at the start of the answer (after blanks and <|python_tag|>),
    or, as upstream's autoparser reads them, after content at a
    `{"name"` (a tail that may start one is held back)."""
    head = skip_ws(rest, 0)
    if rest.startswith(PYTHON_TAG, head):
        head = skip_ws(rest, head + len(PYTHON_TAG))
    elif partial and PYTHON_TAG.startswith(rest[head:]):
        return []  # undecided
    if head >= len(rest):
        return [] if partial else [rest]
    got = _calls(rest, head, partial)
    if got is not None:
        return got
    i = rest.find(CALL_HEAD, head + 1)
    while i >= 0:
        got = _calls(rest, i, partial)
        if got is not None:
            return [rest[:i], *got]
        i = rest.find(CALL_HEAD, i + 1)
    return [hold(rest, CALL_HEAD) if partial else rest]


def _calls(rest: str, pos: int, partial: bool) -> list | None:
    """The call objects from `pos` (';' or blanks between them) and the text
    after them; [] while undecided; None: no call starts there."""
    calls: list = []
    while True:
        try:
            scan = scan_call(rest, pos)
        except Invalid:
            return [*calls, rest[pos:]] if calls else None
        if scan.name is None:
            if partial and scan.end is None:
                return calls  # undecided
            return [*calls, rest[pos:]] if calls else None
        calls.append(scanned_call(rest, scan))
        if scan.end is None:
            return calls
        k = skip_ws(rest, scan.end)
        if rest.startswith(";", k):
            k = skip_ws(rest, k + 1)
        if k < len(rest) and rest[k] == "{":
            pos = k
            continue
        return [*calls, rest[k:]]


def opener(name: str | None) -> str:
    return '{"name": ' + json.dumps(name) + ', "parameters": ' if name else '{"name": "'


def grammar(tools, name: str | None, parallel: bool) -> str:
    rules, alts = [], []
    for i, fn in enumerate(functions(tools, name)):
        rules.append(f"a{i}: " + schema_rule(fn))
        if name is not None:
            alts.append(f"a{i} {lark('}')}")
        else:
            alts.append(lark(fn["name"] + '", "parameters": ') + f" a{i} " + lark("}"))
    return "start: call\ncall: " + " | ".join(
        f"c{i}" for i in range(len(alts))) + "\n" + "".join(
        f"c{i}: {alt}\n" for i, alt in enumerate(alts)) + "\n".join(rules) + "\n"


DIALECT = Dialect("llama3", detect, split, opener=opener, grammar=grammar)

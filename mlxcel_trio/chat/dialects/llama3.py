"""Llama 3.x: the answer is `{"name": ..., "parameters": ...}` (after an
optional <|python_tag|>; several separated by ';'), then any text."""

from __future__ import annotations

import json

from ..jsonscan import Invalid, scan_call, skip_ws
from .base import Dialect, lark, schema_rule, functions
from .base import scanned_call

PYTHON_TAG = "<|python_tag|>"


def detect(src: str) -> bool:
    return "<|start_header_id|>" in src and (PYTHON_TAG in src or '"parameters"' in src
                                             or "ipython" in src)


def split(rest: str, partial: bool, tools=None) -> list:
    """An answer that does not start with a call object is plain content."""
    head = skip_ws(rest, 0)
    if rest.startswith(PYTHON_TAG, head):
        head = skip_ws(rest, head + len(PYTHON_TAG))
    elif partial and PYTHON_TAG.startswith(rest[head:]):
        return []  # undecided
    if head >= len(rest):
        return [] if partial else [rest]
    calls: list = []
    pos = head
    while True:
        try:
            scan = scan_call(rest, pos)
        except Invalid:
            return [*calls, rest[pos:]] if calls else [rest]
        if scan.name is None:
            if partial and scan.end is None:
                return calls  # undecided
            return [*calls, rest[pos:]] if calls else [rest]
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

"""Hermes / Qwen 2.5-3: `<tool_call>{"name": ..., "arguments": ...}</tool_call>`
among the content (also SmolLM3, MiMo, Granite 4, and any template that
spells the tag and is not a family of its own)."""

from __future__ import annotations

import json

from ..jsonscan import Invalid, scan_call, skip_ws
from .base import Dialect, hold, lark, scanned_call, schema_rule, functions

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def split(rest: str, partial: bool, tools=None) -> list:
    items: list = []
    pos = 0
    while True:
        i = rest.find(OPEN, pos)
        if i < 0:
            tail = rest[pos:]
            return [*items, hold(tail, OPEN) if partial else tail]
        j = skip_ws(rest, i + len(OPEN))
        if j >= len(rest):
            # a bare marker: undecided while partial, text at the end
            return [*items, rest[pos:i] if partial else rest[pos:]]
        try:
            scan = scan_call(rest, j)
        except Invalid:
            # not a call: the marker is ordinary text; scan on after it
            items.append(rest[pos:i + len(OPEN)])
            pos = i + len(OPEN)
            continue
        if scan.name is None:
            if partial and scan.end is None:
                return [*items, rest[pos:i]]  # undecided: hold the rest
            # the object (or the output) ended without a name: text
            stop = scan.end if scan.end is not None else len(rest)
            items.append(rest[pos:stop])
            pos = stop
            continue
        items += [rest[pos:i], scanned_call(rest, scan)]
        if scan.end is None:
            return items
        k = skip_ws(rest, scan.end)
        if rest.startswith(CLOSE, k):
            pos = k + len(CLOSE)
        elif partial and CLOSE.startswith(rest[k:]):
            return items
        else:
            pos = scan.end


def opener(name: str | None) -> str:
    return OPEN + "\n" + ('{"name": ' + json.dumps(name) + ', "arguments": ' if name else "")


def grammar(tools, name: str | None, parallel: bool) -> str:
    tail = "}\n" + CLOSE
    rules, alts = [], []
    for i, fn in enumerate(functions(tools, name)):
        rules.append(f"a{i}: " + schema_rule(fn))
        if name is not None:  # the opening already names it and opens the arguments
            alts.append(f"a{i} {lark(tail)}")
        else:
            head = '{"name": ' + json.dumps(fn["name"]) + ', "arguments": '
            alts.append(f"{lark(head)} a{i} {lark(tail)}")
    more = ' ("\\n<tool_call>\\n" call)*' if parallel and name is None else ""
    return "start: call" + more + "\ncall: " + " | ".join(
        f"c{i}" for i in range(len(alts))) + "\n" + "".join(
        f"c{i}: {alt}\n" for i, alt in enumerate(alts)) + "\n".join(rules) + "\n"


DIALECT = Dialect("hermes", lambda src: OPEN in src, split, opener=opener, grammar=grammar)

"""MiniMax M3: its `]<]minimax[>[` namespace before every tag, and each
parameter as an element named after it:

    ]<]minimax[>[<tool_call>
    ]<]minimax[>[<invoke name="NAME">]<]minimax[>[<city>Paris]<]minimax[>[</city>]<]minimax[>[</invoke>
    ]<]minimax[>[</tool_call>

A call shows once its name is written; a parameter streams from its opening
tag (a string as JSON text growing, another value as written), a tail that
may start the namespace held back; the comma comes with the next key.  A
value that nests elements (objects, lists) is read as its text."""

from __future__ import annotations

import json
import re

from ..jsonscan import skip_ws
from .base import (INVALID, UNDECIDED, Dialect, ToolCall, arg_value, call_section, functions,
                   hold, lark, marked, schema_rule, string_typed)
from .pythonic import is_text, literals

NS = "]<]minimax[>["
OPEN, CLOSE = NS + "<tool_call>", NS + "</tool_call>"
INVOKE, INVOKE_END = NS + '<invoke name="', NS + "</invoke>"
_KEY = re.compile(r"<([^<>/\s]+)>")


def _invoke(s: str, k: int, tools):
    """One invoke from after its `name="`: (ToolCall, end or None), or
    UNDECIDED / INVALID before its name is complete."""
    e = s.find('">', k)
    if e < 0:
        return UNDECIDED if re.fullmatch(r'[^"<>]*"?', s[k:]) else INVALID
    name, j, args = s[k:e], e + 2, "{"
    if not name or any(c in name for c in '<>"'):
        return INVALID
    while True:
        j = skip_ws(s, j)
        if s.startswith(INVOKE_END, j):
            return ToolCall(name, args + "}"), j + len(INVOKE_END)
        if not s.startswith(NS, j):
            if NS.startswith(s[j:]) or INVOKE_END.startswith(s[j:]):
                return ToolCall(name, args, complete=False), None  # a tag arriving
            return ToolCall(name, args, complete=False), None if j >= len(s) else j
        key = _KEY.match(s, j + len(NS))
        if not key:
            return ToolCall(name, args, complete=False), None
        head = args + ("," if args != "{" else "") + json.dumps(key.group(1), ensure_ascii=False) + ":"
        text = string_typed(tools, name, key.group(1))
        v = key.end()
        close = NS + "</" + key.group(1) + ">"
        ve = s.find(close, v)
        if ve < 0:  # the value is arriving
            so_far = hold(s[v:], close)
            if text:
                return ToolCall(name, head + json.dumps(so_far, ensure_ascii=False)[:-1],
                                complete=False), None
            # a typed value as written; an untyped one once complete (it may be text)
            return ToolCall(name, head + (so_far.strip() if text is False else ""),
                            complete=False), None
        args = head + arg_value(tools, name, key.group(1), s[v:ve])
        j = ve + len(close)


_block = call_section(INVOKE, CLOSE, lambda s, i, partial, tools: _invoke(s, i, tools))


def opener(name: str | None) -> str:
    return OPEN + "\n" + INVOKE + (name + '">' if name else "")


def grammar(tools, name: str | None, parallel: bool) -> str:
    """Each parameter once, in the schema's order (the optional ones may be
    left out): a string as text without the namespace's characters (an
    enum's values as written), another as JSON of its schema."""
    rules, alts = [], []
    for i, fn in enumerate(functions(tools, name)):
        params = fn.get("parameters") or {}
        required = set(params.get("required") or ())
        parts = [] if name else [lark(fn["name"] + '">')]
        for k, (key, spec) in enumerate((params.get("properties") or {}).items()):
            spec = spec if isinstance(spec, dict) else {}
            value = (literals(spec, str) or r"/[^<\]]*/") if is_text(spec) else \
                schema_rule({"parameters": spec})
            rules.append(f"v{i}_{k}: {value}")
            param = f"{lark(NS + '<' + key + '>')} v{i}_{k} {lark(NS + '</' + key + '>')}"
            parts.append(param if key in required else f"({param})?")
        alts.append("(" + " ".join(parts + [lark(INVOKE_END + "\n" + CLOSE)]) + ")")
    return "start: call\ncall: " + " | ".join(alts) + "\n" + "\n".join(rules) + "\n"


DIALECT = Dialect(
    "minimax_m3", lambda src: NS in src and "<tool_call>" in src and "<invoke name=" in src,
    marked("minimax_m3", OPEN, _block), opener=opener, grammar=grammar, blank_content=True,
    settles=False, think=("<mm:think>", "</mm:think>"))

"""MiniMax M3: its `]<]minimax[>[` namespace before every tag, and each
parameter as an element named after it:

    ]<]minimax[>[<tool_call>
    ]<]minimax[>[<invoke name="NAME">]<]minimax[>[<city>Paris]<]minimax[>[</city>]<]minimax[>[</invoke>
    ]<]minimax[>[</tool_call>

A call shows once its name is written; a parameter streams from its opening
tag (a string as JSON text growing, another value as written), a tail that
may start the namespace held back; the comma comes with the next key.  A
parameter whose schema is an object with properties or a list with items
is written as nested elements (`<key>` per member, `<item>` per entry, as
the template's to_xml expands it) and read by that schema into JSON,
streamed as upstream's: a container opens at its tag, a member or entry as
a value does, and closes at its closing tag."""

from __future__ import annotations

import json
import re

from ..jsonscan import skip_ws
from .base import (INVALID, UNDECIDED, Dialect, ToolCall, arg_value, call_section, functions,
                   hold, lark, marked, param_schema, schema_rule, string_typed)
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
        spec = param_schema(tools, name, key.group(1))
        if _nests(spec):
            value, end = _nested(s, v, spec, close)
            if end is None:
                return ToolCall(name, head + value, complete=False), None
            args, j = head + value, end
            continue
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


def _nests(spec: dict) -> bool:
    """The template writes the value as elements and upstream reads it by the schema."""
    return spec.get("type") == "object" and isinstance(spec.get("properties"), dict) \
        or spec.get("type") == "array" and isinstance(spec.get("items"), dict)


def _nested(s: str, i: int, spec: dict, close: str) -> tuple[str, int | None]:
    """An object's members or a list's `<item>`s from `s[i]` up to `close`:
    (JSON text, the index after `close`, or None while arriving)."""
    obj = spec["type"] == "object"
    out = "{" if obj else "["
    while True:
        i = skip_ws(s, i)
        if s.startswith(close, i):
            return out + ("}" if obj else "]"), i + len(close)
        tag = _KEY.match(s, i + len(NS)) if s.startswith(NS, i) else None
        if tag is None or not obj and tag.group(1) != "item":
            return out, None  # a tag arriving (or none upstream reads: the value stops here)
        sub = (spec["properties"].get(tag.group(1)) if obj else spec["items"]) or {}
        out += ("," if out[-1] not in "{[" else "") + (
            json.dumps(tag.group(1), ensure_ascii=False) + ":" if obj else "")
        value, i = _element(s, tag.end(), sub, NS + "</" + tag.group(1) + ">")
        out += value
        if i is None:
            return out, None


def _element(s: str, v: int, spec: dict, close: str) -> tuple[str, int | None]:
    """One member's or entry's value: nested, a string (as written), or JSON text."""
    if _nests(spec):
        return _nested(s, v, spec, close)
    ve = s.find(close, v)
    text = is_text(spec)
    if ve < 0:
        so_far = hold(s[v:], close)
        return (json.dumps(so_far, ensure_ascii=False)[:-1] if text else so_far.strip()), None
    value = s[v:ve]
    return (json.dumps(value, ensure_ascii=False) if text else value.strip()), ve + len(close)


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
            param = _element_rule(f"v{i}_{k}", key, spec, rules)
            parts.append(param if key in required else f"({param})?")
        alts.append("(" + " ".join(parts + [lark(INVOKE_END + "\n" + CLOSE)]) + ")")
    return "start: call\ncall: " + " | ".join(alts) + "\n" + "\n".join(rules) + "\n"


def _element_rule(rule: str, tag: str, spec: dict, rules: list[str]) -> str:
    """`NS<tag>value NS</tag>` with the value as the template writes it: a
    string as text (an enum's values as written), an object's properties or a
    list's items as elements (each required member once, in the schema's
    order), anything else as JSON of its schema."""
    if _nests(spec) and spec["type"] == "object":
        required = set(spec.get("required") or ())
        members = []
        for k, (key, sub) in enumerate(spec["properties"].items()):
            member = _element_rule(f"{rule}_{k}", key, sub if isinstance(sub, dict) else {}, rules)
            members.append(member if key in required else f"({member})?")
        value = "(" + " ".join(members) + ")" if members else '""'
    elif _nests(spec):
        value = "(" + _element_rule(rule + "_i", "item", spec["items"], rules) + ")*"
    else:
        rules.append(f"{rule}: " + ((literals(spec, str) or r"/[^<\]]*/") if is_text(spec)
                                    else schema_rule({"parameters": spec})))
        value = rule
    return f"{lark(NS + '<' + tag + '>')} {value} {lark(NS + '</' + tag + '>')}"


DIALECT = Dialect(
    "minimax_m3", lambda src: NS in src and "<tool_call>" in src and "<invoke name=" in src,
    marked("minimax_m3", OPEN, _block), opener=opener, grammar=grammar, blank_content=True,
    settles=False, think=("<mm:think>", "</mm:think>"))

"""LFM2 / LFM2.5: a list of Python-style calls,
`<|tool_call_start|>[f(a="x", b=1), g()]<|tool_call_end|>`.

The arguments stream as the JSON object they become, as upstream's do: a
call shows as `{` once its `(` is written, a key once its `=` is, a string
value from its opening quote on (its text as written, Python escapes being
JSON's, blanks kept, an escape cut short held back), another value as
written; a comma only with the next key.  The
same scan reads a finished call, so every partial parse is a prefix of the
final one.  Python's True / False / None are JSON's once complete."""

from __future__ import annotations

import json
import re

from ..jsonscan import skip_ws
from .base import INVALID, UNDECIDED, Dialect, ToolCall, marked, schema_rule
from .pythonic import literals, keyword_grammar

LFM_OPEN, LFM_CLOSE = "<|tool_call_start|>", "<|tool_call_end|>"
_NAME = re.compile(r"[A-Za-z_][\w.\-]*")
_KEY = re.compile(r"\s*([A-Za-z_]\w*)\s*=")
_WORDS = {"True": "true", "False": "false", "None": "null"}


def _string(s: str, i: int) -> tuple[str, int | None]:
    """A quoted Python string at s[i] as JSON text: (text, index after it),
    or (text so far without its closing quote, None) when it is cut short."""
    quote, out, k = s[i], ['"'], i + 1
    while k < len(s):
        ch = s[k]
        if ch == "\\":
            if k + 1 >= len(s):  # an escape cut short: held back
                return "".join(out), None
            nxt = s[k + 1]
            out.append("'" if nxt == "'" else "\\" + nxt)
            k += 2
            continue
        if ch == quote:
            return "".join(out) + '"', k + 1
        out.append('\\"' if ch == '"' else ch)
        k += 1
    return "".join(out), None


def _value(s: str, i: int) -> tuple[str, int | None]:
    """Any other value: its text up to a `,` or `)` outside brackets."""
    depth, k = 0, i
    while k < len(s):
        ch = s[k]
        if ch in "\"'":
            _, e = _string(s, k)
            if e is None:
                return s[i:].strip(), None
            k = e
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif ch == "," and depth == 0:
            break
        k += 1
    text = s[i:k].strip()
    if k >= len(s):  # it may go on
        return ("" if any(w.startswith(text) for w in _WORDS) else text), None
    return _WORDS.get(text, text), k


def _call(s: str, i: int):
    """One call from its name: (ToolCall, index after `)` or None), or
    UNDECIDED / INVALID before its `(`."""
    m = _NAME.match(s, i)
    if not m or m.end() >= len(s):
        return UNDECIDED if (m or i >= len(s)) else INVALID
    if s[m.end()] != "(":
        return INVALID
    name, k, args = m.group(), m.end() + 1, "{"
    while True:
        k = skip_ws(s, k)
        if k >= len(s):
            return ToolCall(name, args, complete=False), None
        if s[k] == ")":
            return ToolCall(name, args + "}"), k + 1
        if args != "{":
            if s[k] != ",":
                return ToolCall(name, args, complete=False), None
            k = skip_ws(s, k + 1)
        key = _KEY.match(s, k)
        if not key:
            return ToolCall(name, args, complete=False), None
        args += ("," if args != "{" else "") + json.dumps(key.group(1)) + ":"
        k = skip_ws(s, key.end())
        if k >= len(s):
            return ToolCall(name, args, complete=False), None
        text, k = _string(s, k) if s[k] in "\"'" else _value(s, k)
        args += text
        if k is None:
            return ToolCall(name, args, complete=False), None


def _block(s: str, j: int, partial: bool, tools):
    k = skip_ws(s, j)
    if k >= len(s):
        return UNDECIDED if partial else INVALID
    if s[k] != "[":
        return INVALID
    calls: list[ToolCall] = []
    k = skip_ws(s, k + 1)
    while True:
        got = _call(s, k)
        if got in (UNDECIDED, INVALID):
            if calls:
                return calls, None if partial else k
            return got if partial or got == INVALID else INVALID
        call, e = got
        calls.append(call)
        if e is None:
            return calls, None
        k = skip_ws(s, e)
        if k < len(s) and s[k] == ",":
            k = skip_ws(s, k + 1)
            continue
        if k < len(s) and s[k] == "]":
            c = skip_ws(s, k + 1)
            if s.startswith(LFM_CLOSE, c):
                return calls, c + len(LFM_CLOSE)
            if partial and LFM_CLOSE.startswith(s[c:]):
                return calls, None
            return calls, k + 1
        return calls, None if partial or k >= len(s) else k


DIALECT = Dialect(
    "lfm2", lambda src: LFM_OPEN in src or "List of tools: [" in src or
    "<|tool_list_start|>" in src, marked("lfm2", LFM_OPEN, _block), blank_content=True, settles=False,
    opener=lambda name: LFM_OPEN + "[" + (name + "(" if name else ""), fixed_think=True,
    grammar=keyword_grammar(
        "(", "=",
        lambda spec: literals(spec, lambda v: json.dumps(v)) or r'/"([^"\\\n]|\\.)*"/',
        lambda spec: '"True" | "False"' if spec.get("type") == "boolean"
        else schema_rule({"parameters": spec}),
        ", ", ")]" + LFM_CLOSE))

"""Calls in their own small syntaxes (LFM2's Python-call list is in
lfm2.py, with the keyword grammar from here): Gemma 4's
`<|tool_call>call:NAME{key:<|"|>text<|"|>}<tool_call|>`, and MiniCPM 5's
`<function name="NAME"><param name="K">V</param></function>`.  Gemma's
arguments stream as JSON."""

from __future__ import annotations

import json
import re

from .base import (INVALID, UNDECIDED, Dialect, ToolCall, functions, hold, lark,
                   marked, read_name, schema_rule, tag_grammar, tagged_params)

# -- forced calls ----------------------------------------------------------------------------

def is_text(spec: dict) -> bool:
    values = spec.get("enum") or []
    return spec.get("type") == "string" or bool(values) and all(isinstance(v, str) for v in values)


def keyword_grammar(after_name: str, key: str, text, other, between: str, tail: str):
    """A forced call written `NAME after_name k1<key>v1<between>k2<key>v2 tail`
    (the opener wrote up to the name, or for a named call up to after_name):
    the required parameters in the schema's order (the optional ones left
    out); `text(spec)` is a string parameter's rule, `other(spec)` another's."""

    def grammar(tools, name, parallel) -> str:
        rules, alts = [], []
        for i, fn in enumerate(functions(tools, name)):
            params = fn.get("parameters") or {}
            required = set(params.get("required") or ())
            parts = [] if name else [lark(fn["name"] + after_name)]
            for k, (pkey, spec) in enumerate((params.get("properties") or {}).items()):
                if pkey not in required:
                    continue
                spec = spec if isinstance(spec, dict) else {}
                rules.append(f"v{i}_{k}: " + (text(spec) if is_text(spec) else other(spec)))
                if len(parts) > (0 if name else 1):
                    parts.append(lark(between))
                parts += [lark(pkey + key), f"v{i}_{k}"]
            alts.append("(" + " ".join(parts + [lark(tail)]) + ")")
        return "start: call\ncall: " + " | ".join(alts) + "\n" + "\n".join(rules) + "\n"
    return grammar


def literals(spec: dict, quote) -> str | None:
    values = spec.get("enum")
    return " | ".join(lark(quote(v)) for v in values) if values else None


# -- Gemma 4 --------------------------------------------------------------------------------

G_OPEN, G_CLOSE, G_QUOTE = "<|tool_call>call:", "<tool_call|>", '<|"|>'


def _gemma_json(text: str) -> str:
    """Gemma's object syntax (bare keys, <|"|> quotes) as JSON text."""
    parts = text.split(G_QUOTE)
    out = []
    for k, part in enumerate(parts):
        if k % 2:
            out.append(json.dumps(part, ensure_ascii=False))
        else:
            out.append(re.sub(r"([{,]\s*)([A-Za-z_][\w\-]*)\s*:", r'\1"\2":', part))
    value = "".join(out)
    json.loads(value)
    return value


def _gemma_prefix(text: str) -> str:
    """An arriving Gemma object as the JSON text it is becoming, as
    upstream streams it: a key from its first letter (`{"ci`), a string
    from the first character of its quote, a tail that may start a quote
    held back; nothing after the object closes."""
    out: list[str] = []
    stack: list[str] = []
    i, in_key, expect_key = 0, False, False
    while i < len(text):
        if text.startswith(G_QUOTE, i):
            q = text.find(G_QUOTE, i + len(G_QUOTE))
            body = text[i + len(G_QUOTE):] if q < 0 else text[i + len(G_QUOTE):q]
            if q < 0:
                body = hold(body, G_QUOTE)
            quoted = json.dumps(body, ensure_ascii=False)
            out.append(quoted if q >= 0 else quoted[:-1])
            if q < 0:
                break
            i = q + len(G_QUOTE)
            continue
        if G_QUOTE.startswith(text[i:]):
            out.append('"')  # a quote still arriving
            break
        ch = text[i]
        i += 1
        if in_key:
            if ch == ":":
                out.append('":')
                in_key = False
            elif not ch.isspace():
                out.append(ch)
            continue
        if ch.isspace():
            continue
        if expect_key and (ch.isalnum() or ch in "_-"):
            out.append('"' + ch)
            in_key, expect_key = True, False
            continue
        out.append(ch)
        expect_key = False
        if ch in "{[":
            stack.append(ch)
            expect_key = ch == "{"
        elif ch == "," and stack and stack[-1] == "{":
            expect_key = True
        elif ch in "}]" and stack:
            stack.pop()
            if not stack:
                break
    return "".join(out)


def _gemma_block(s: str, j: int, partial: bool, tools):
    got = read_name(s, j, "{", partial)
    if got in (UNDECIDED, INVALID):
        return got
    name, v = got
    e = s.find(G_CLOSE, v)
    if e < 0:
        return [ToolCall(name, _gemma_prefix("{" + s[v:]), complete=False)], None
    try:
        args = _gemma_json("{" + s[v:e])
    except ValueError:
        return INVALID
    return [ToolCall(name, args)], e + len(G_CLOSE)


GEMMA4 = Dialect("gemma4", lambda src: "'<|tool_call>call:'" in src,
                 marked("gemma4", G_OPEN, _gemma_block),
                 think=("<|channel>thought", "<channel|>"), blank_content=True,
                 trims_thought_lead=True, thinks_after_close=True, settles=False,
                 opener=lambda name: G_OPEN + (name + "{" if name else ""),
                 grammar=keyword_grammar(
                     "{", ":",
                     lambda spec: literals(spec, lambda v: G_QUOTE + v + G_QUOTE)
                     or f"{lark(G_QUOTE)} /[^<]*/ {lark(G_QUOTE)}",
                     lambda spec: schema_rule({"parameters": spec}), ",", "}" + G_CLOSE))

# -- MiniCPM 5 ------------------------------------------------------------------------------

M_OPEN = '<function name="'


def _cdata(value: str) -> str:
    v = value.strip()
    return v[9:-3] if v.startswith("<![CDATA[") and v.endswith("]]>") else value


def _minicpm_block(s: str, j: int, partial: bool, tools):
    got = read_name(s, j, '">', partial)
    if got in (UNDECIDED, INVALID):
        return got
    name, v = got
    got = tagged_params(s, v, name, tools, '<param name="', '">', "</param>", "</function>",
                        partial)
    if got == INVALID:
        return INVALID
    call, end = got
    return [call], end


MINICPM5 = Dialect(
    "minicpm5", lambda src: "Tool usage guidelines:" in src and M_OPEN in src
    and '<param name="' in src, marked("minicpm5", M_OPEN, _minicpm_block),
    opener=lambda name: M_OPEN + (name + '">' if name else ""),
    grammar=tag_grammar('">', '<param name="', '">', "</param>", "</function>"))

"""Kimi K3: the message is a run of tagged blocks, each tag written
`<|open|>TAG ATTR="V"...<|sep|>` and closed by `<|close|>TAG<|sep|>`:

    <|open|>think<|sep|>THOUGHTS<|close|>think<|sep|>
    <|open|>response<|sep|>ANSWER<|close|>response<|sep|>
    <|open|>tools<|sep|>
      <|open|>call tool="NAME" index="1"<|sep|>
        <|open|>argument key="K" type="string"<|sep|>VALUE<|close|>argument<|sep|>
        (or <|open|>json type="object"<|sep|>{...}<|close|>json<|sep|>)
      <|close|>call<|sep|>
    <|close|>tools<|sep|><|close|>message<|sep|>

The prompt opens the thinking block.  As upstream reads it, the thoughts
end at their closing tag or where a response block opens (a model may skip
the closing tag), whatever they contain; the answer is the response block's
text, not the markers; an argument's `type` says whether its value is a
string or JSON text as written.  Under reasoning "none" the thoughts lead
the content, markers left out.
"""

from __future__ import annotations

import json
import re
from typing import Sequence

from .base import INVALID, Dialect, Parsed, ToolCall, hold, lark, schema_rule, soft_failure

OPEN, CLOSE, SEP = "<|open|>", "<|close|>", "<|sep|>"


def opened(tag: str) -> str:
    return OPEN + tag + SEP


def closed(tag: str) -> str:
    return CLOSE + tag + SEP


THINK, THINK_END = opened("think"), closed("think")
RESPONSE, RESPONSE_END = opened("response"), closed("response")
TOOLS, TOOLS_END = opened("tools"), closed("tools")
CALL, CALL_END = OPEN + "call", closed("call")
ARGUMENT, ARGUMENT_END = OPEN + "argument", closed("argument")
JSON, JSON_END = OPEN + "json", closed("json")
MESSAGE_END = closed("message")

_ATTR = re.compile(r'(\w+)="([^"]*)"')


def _unescape(value: str) -> str:
    return value.replace("&quot;", '"').replace("&amp;", "&")


def _attrs(header: str) -> dict[str, str]:
    return {k: _unescape(v) for k, v in _ATTR.findall(header)}


def _properties(tools, name: str) -> set[str]:
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else {}
        if fn.get("name") == name:
            return set((fn.get("parameters") or {}).get("properties") or {})
    return set()


def _value(kind: str, text: str, done: bool) -> str:
    """An argument's JSON text: a string's value as written, quoted (open
    while still arriving), another type's text as written."""
    if kind == "string":
        quoted = json.dumps(text, ensure_ascii=False)
        return quoted if done else quoted[:-1]
    text = text.strip()
    if done:
        try:
            json.loads(text)
        except ValueError:
            return json.dumps(text, ensure_ascii=False)
    return text


def _call(s: str, i: int, partial: bool, tools):
    """The call whose header starts at `s[i]` (`<|open|>call`): (call, end
    or None while arriving), or None when not yet named (partial) or not a call."""
    h = s.find(SEP, i)
    if h < 0:
        return None
    name = _attrs(s[i + len(CALL):h]).get("tool", "")
    if not name:
        return None
    pairs: list[str] = []
    j = h + len(SEP)

    def arriving(extra: str = ""):
        body = ",".join(pairs + ([extra] if extra else []))
        return ToolCall(name, "{" + body, complete=False), None
    while True:
        while j < len(s) and s[j] in " \t\r\n":
            j += 1
        rest = s[j:]
        if rest.startswith(CALL_END):
            return ToolCall(name, "{" + ",".join(pairs) + "}"), j + len(CALL_END)
        if rest.startswith(JSON):
            h = s.find(SEP, j)
            if h < 0:
                return arriving()
            e = s.find(JSON_END, h)
            body = s[h + len(SEP):] if e < 0 else s[h + len(SEP):e]
            if e < 0:
                return ToolCall(name, (hold(body, JSON_END) if partial else body).strip(),
                                complete=False), None
            pairs = [body.strip().removeprefix("{").removesuffix("}")] if body.strip() else []
            j = e + len(JSON_END)
            continue
        if rest.startswith(ARGUMENT):
            h = s.find(SEP, j)
            header = s[j + len(ARGUMENT):] if h < 0 else s[j + len(ARGUMENT):h]
            attrs = _attrs(header)
            key = attrs.get("key")
            if key is None:
                # a key still arriving counts once it names one of the tool's parameters
                m = re.search(r'key="([^"]*)$', header)
                key = m.group(1) if m and m.group(1) in _properties(tools, name) else None
            if h < 0:
                return arriving(json.dumps(key, ensure_ascii=False) + ":" if key else "")
            head = json.dumps(key or "", ensure_ascii=False) + ":"
            kind = attrs.get("type", "string")
            v = h + len(SEP)
            e = s.find(ARGUMENT_END, v)
            if e < 0:
                text = hold(s[v:], ARGUMENT_END) if partial else s[v:]
                return arriving(head + _value(kind, text, False))
            pairs.append(head + _value(kind, s[v:e], True))
            j = e + len(ARGUMENT_END)
            continue
        if partial and any(m.startswith(rest) for m in (CALL_END, JSON, ARGUMENT)):
            return arriving()
        if not rest:
            return arriving()
        return ToolCall(name, "{" + ",".join(pairs) + "}", complete=False), j


def _tools(s: str, j: int, partial: bool, tools, calls: list[ToolCall]):
    """Calls of the tools block from `s[j]` (after its opening tag) into
    `calls`: the index after the block, None when the output ends inside it,
    INVALID for a call with no name in a final parse."""
    while True:
        while j < len(s) and s[j] in " \t\r\n":
            j += 1
        rest = s[j:]
        if rest.startswith(TOOLS_END):
            return j + len(TOOLS_END)
        if rest.startswith(CALL):
            got = _call(s, j, partial, tools)
            if got is None:
                return None if partial else INVALID
            call, j = got
            calls.append(call)
            if j is None:
                return None
            continue
        if partial and (not rest or any(m.startswith(rest) for m in (TOOLS_END, CALL))):
            return None
        return j


def message(text: str, partial: bool, reasoning: bool = True, thinking_open: bool = False,
            tools=None) -> Parsed:
    thoughts = ""
    pos = 0
    in_response = False
    if not thinking_open:
        lead = len(text) - len(text.lstrip())
        if text.startswith(THINK, lead):
            thinking_open, pos = True, lead + len(THINK)
        elif partial and THINK.startswith(text[lead:]) and text[lead:]:
            return Parsed()
        elif not any(text.startswith(m, lead) or partial and m.startswith(text[lead:])
                     for m in (RESPONSE, TOOLS)):
            in_response = True  # the prompt opened the response block
    if thinking_open:
        ends = [(i, m) for m in (THINK_END, RESPONSE) if (i := text.find(m, pos)) >= 0]
        if not ends:
            body = text[pos:]
            thoughts = hold(body, THINK_END, RESPONSE) if partial else body
            if partial and reasoning and not thoughts.strip():
                thoughts = ""  # blanks that may yet stand before a response block
            return Parsed(reasoning_content=thoughts) if reasoning else Parsed(content=thoughts)
        e, marker = min(ends)
        thoughts = text[pos:e]
        pos = e + len(marker) if marker == THINK_END else e
    content: list[str] = [] if reasoning else [thoughts]
    calls: list[ToolCall] = []
    while pos < len(text):
        if in_response or text.startswith(RESPONSE, pos):
            start = pos if in_response else pos + len(RESPONSE)
            in_response = False
            e = text.find(RESPONSE_END, start)
            if e < 0:
                body = text[start:]
                content.append(hold(body, RESPONSE_END) if partial else body)
                break
            content.append(text[start:e])
            pos = e + len(RESPONSE_END)
        elif text.startswith(TOOLS, pos):
            before = len(calls)
            end = _tools(text, pos + len(TOOLS), partial, tools, calls)
            if end == INVALID:  # upstream's soft failure: the block is content
                soft_failure("kimi_k3", text[pos:])
                del calls[before:]
                content.append(text[pos:])
                break
            if end is None:
                break
            pos = end
        elif text.startswith(MESSAGE_END, pos):
            break  # what follows the message is no part of it
        elif text[pos] in " \t\r\n":
            pos += 1
        else:
            rest = text[pos:]
            if partial and any(m.startswith(rest) for m in (RESPONSE, TOOLS, MESSAGE_END)):
                break
            # text outside any block: content, up to the next block
            nxt = [i for m in (RESPONSE, TOOLS, MESSAGE_END) if (i := text.find(m, pos)) >= 0]
            e = min(nxt, default=len(text))
            content.append(hold(text[pos:e], RESPONSE, TOOLS, MESSAGE_END)
                           if partial and e == len(text) else text[pos:e])
            pos = e
    return Parsed(content="".join(content), reasoning_content=thoughts if reasoning else "",
                  tool_calls=tuple(calls))


# -- forced calls ---------------------------------------------------------------------------

def opener(name: str | None) -> str:
    return TOOLS + CALL + ' tool="' + (name + '" index="1"' + SEP if name else "")


_TYPES = {"string": "string", "number": "number", "integer": "number", "boolean": "boolean",
          "object": "object", "array": "array", "null": "null"}


def _kind(spec: dict) -> str:
    """The `type` an argument tag says (the template's own names); a
    typeless enum of strings is a string."""
    kind = spec.get("type")
    if isinstance(kind, str) and kind in _TYPES:
        return _TYPES[kind]
    values = spec.get("enum") or ([spec["const"]] if "const" in spec else [])
    if values and all(isinstance(v, str) for v in values):
        return "string"
    return "object"  # any JSON value, written as JSON


def grammar(tools: Sequence[dict], name: str | None, parallel: bool) -> str:
    """Each call's arguments as typed argument tags, in the schema's order
    (the optional ones may be left out), then the tools block closes."""
    from .base import functions
    rules: list[str] = []
    alts = []
    for i, fn in enumerate(functions(tools, name)):
        params = fn.get("parameters") or {}
        required = set(params.get("required") or ())
        parts = [] if name else [lark(fn["name"] + '" index="1"' + SEP)]
        for k, (key, spec) in enumerate((params.get("properties") or {}).items()):
            spec = spec if isinstance(spec, dict) else {}
            kind = _kind(spec)
            value = schema_rule({"parameters": spec})
            if kind == "string":  # written bare: any text, or one of its enum's
                value = " | ".join(lark(v) for v in spec["enum"]) if spec.get("enum") \
                    else "/[^<]*/"
            rules.append(f"v{i}_{k}: {value}")
            tag = lark(ARGUMENT + f' key="{key}" type="{kind}"' + SEP)
            param = f"{tag} v{i}_{k} {lark(ARGUMENT_END)}"
            parts.append(param if key in required else f"({param})?")
        parts.append(lark(CALL_END))
        alts.append("(" + " ".join(parts) + ")")
    more = f" ({lark(CALL + ' tool=' + chr(34))} call)*" if parallel and name is None else ""
    return (f"start: call{more} {lark(TOOLS_END)}\ncall: " + " | ".join(alts) + "\n"
            + "\n".join(rules) + "\n")


def detect(src: str) -> bool:
    return all(m in src for m in ("'<|open|>'", "'<|close|>'", "'<|sep|>'", "tool-declare"))


DIALECT = Dialect("kimi_k3", detect, message=message, think=(THINK, THINK_END),
                  opener=opener, grammar=grammar)

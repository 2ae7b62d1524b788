"""The families whose calls are a JSON list (or object) after a marker:
Command R7B and Cohere2 MoE, Granite 3.3, FireFunction v2, Nemotron Nano v2,
Apriel 1.5, GigaChat 3, Apertus; plus Functionary v3.1 / v3.2."""

from __future__ import annotations

import json

import attrs

from ..jsonscan import skip_ws
from .base import (INVALID, UNDECIDED, Dialect, ToolCall, hold, json_call, json_grammar,
                   json_list, json_list_grammar, json_list_opener, marked, read_json, read_name)


def _list(name: str, marker: str, close: str = "", name_key: str = "name",
          args_key: str = "arguments", id_key: str = "id", extra: str = "", **kw) -> Dialect:
    return Dialect(name, kw.pop("detect"), marked(name, marker, json_list(close, name_key, id_key)),
                   opener=json_list_opener(marker, name_key, args_key, extra),
                   grammar=json_list_grammar(marker, name_key, args_key, close), **kw)


_COHERE = dict(name_key="tool_name", args_key="parameters", id_key="tool_call_id",
               extra='"tool_call_id": "0", ', think=("<|START_THINKING|>", "<|END_THINKING|>"))
COMMAND_R7B = _list(
    "command_r7b", "<|START_ACTION|>", "<|END_ACTION|>", **_COHERE,
    detect=lambda src: "<|START_ACTION|>" in src and "<|START_RESPONSE|>" in src,
    content_wrap=("<|START_RESPONSE|>", "<|END_RESPONSE|>"))
COHERE2 = _list(
    "cohere2moe", "<|START_ACTION|>", "<|END_ACTION|>", **_COHERE,
    detect=lambda src: "<|START_TEXT|>" in src and "<|START_ACTION|>" in src,
    content_wrap=("<|START_TEXT|>", "<|END_TEXT|>"),
    # its prompt opens the thinking block; an answer or an action may end it unclosed
    calls_end_thoughts=("<|START_TEXT|>", "<|START_ACTION|>"))
GRANITE = _list("granite", "<|tool_call|>",
                detect=lambda src: "<|tool_call|>" in src,
                content_wrap=("<response>", "</response>"))
FIREFUNCTION = _list("firefunction_v2", " functools", detect=lambda src: "functools[" in src)
NEMOTRON_V2 = _list("nemotron_v2", "<TOOLCALL>", "</TOOLCALL>",
                    detect=lambda src: "<TOOLCALL>" in src)
# Apriel 1.6 thinks from the assistant header's line to the final-response
# marker (its prompt opens the block); 1.5's template has no such block
APRIEL = _list("apriel", "<tool_calls>", "</tool_calls>",
               detect=lambda src: "[BEGIN FINAL RESPONSE]" in src,
               think=("<|begin_assistant|>\n", "[BEGIN FINAL RESPONSE]"), raw_thoughts=True)
def _gigachat(opener: str, name: str | None) -> str:
    return opener + ('{"name": "' + name + '", "arguments": ' if name else '{"name": "')


_GIGACHAT3_CALL = "<|message_sep|>\n\nfunction call<|role_sep|>"
GIGACHAT3 = Dialect(
    "gigachat3",
    lambda src: "<|role_sep|>" in src and "<|message_sep|>" in src,
    marked("gigachat3", _GIGACHAT3_CALL, json_list(bracket=False)),
    opener=lambda name: _gigachat(_GIGACHAT3_CALL + "\n", name),
    grammar=json_grammar('", "arguments": ', "}"))
# GigaChat 3.1 writes `<|function_call|>{"name", "arguments"}` inside its
# answer (upstream reads it with its autoparser, the marker then no separator
# of its own: blank lines before it stay content, as the generic dialect's)
_GIGACHAT31_CALL = "<|function_call|>"
GIGACHAT31 = attrs.evolve(
    GIGACHAT3, split=marked("gigachat3", _GIGACHAT31_CALL, json_list(bracket=False)),
    opener=lambda name: _gigachat(_GIGACHAT31_CALL, name), none_is_flat=False)


def gigachat_variant(dialect: Dialect, src: str) -> Dialect:
    return GIGACHAT31 if dialect is GIGACHAT3 and _GIGACHAT31_CALL in src else dialect


# -- Apertus: [{"NAME": {args}}] ------------------------------------------------------------

APERTUS_OPEN, APERTUS_CLOSE = "<|tools_prefix|>", "<|tools_suffix|>"


def _apertus_block(s: str, j: int, partial: bool, tools):
    k = skip_ws(s, j)
    if k >= len(s):
        return UNDECIDED if partial else INVALID
    if s[k] != "[":
        return INVALID
    calls: list[ToolCall] = []
    k = skip_ws(s, k + 1)
    while True:
        if k >= len(s):
            return (calls, None) if calls else (UNDECIDED if partial else INVALID)
        if s[k] == "]" and calls:
            c = skip_ws(s, k + 1)
            if s.startswith(APERTUS_CLOSE, c):
                return calls, c + len(APERTUS_CLOSE)
            return (calls, None) if partial and APERTUS_CLOSE.startswith(s[c:]) else (calls, k + 1)
        if s[k] != "{":
            return (calls, k) if calls else INVALID
        got = read_json(s, k + 1)
        if partial and got != INVALID and got[1] is None and got[0] in ("", '"'):
            return (calls, None) if calls else UNDECIDED
        if got == INVALID or not got[0].startswith('"'):
            return (calls, k) if calls else INVALID
        written, v = got
        c = skip_ws(s, v) if v is not None else len(s)
        if v is None or c >= len(s):
            if partial:
                return (calls, None) if calls else UNDECIDED
            return (calls, k) if calls else INVALID
        if s[c] != ":":
            return (calls, k) if calls else INVALID
        got = json_call(json.loads(written), s, c + 1, "}", partial)
        if got == INVALID:
            return (calls, k) if calls else INVALID
        call, e = got
        calls.append(call)
        if e is None:
            return calls, None
        k = skip_ws(s, e)
        if k < len(s) and s[k] == ",":
            k = skip_ws(s, k + 1)


APERTUS = Dialect(
    "apertus", lambda src: APERTUS_OPEN in src, marked("apertus", APERTUS_OPEN, _apertus_block),
    think=("<|inner_prefix|>", "<|inner_suffix|>"),
    opener=lambda name: APERTUS_OPEN + "[{" + ('"' + name + '": ' if name else '"'),
    grammar=json_grammar('": ', "}]" + APERTUS_CLOSE))


# -- Functionary ----------------------------------------------------------------------------

def _v3_1_block(s: str, j: int, partial: bool, tools):
    got = read_name(s, j, ">", partial)
    if got in (UNDECIDED, INVALID):
        return got
    name, v = got
    got = json_call(name, s, v, "</function>", partial)
    if got == INVALID:
        return INVALID
    call, end = got
    return [call], end


FUNCTIONARY_V3_1 = Dialect(
    "functionary_v3_1", lambda src: "<function=" in src and "<|start_header_id|>" in src,
    marked("functionary_v3_1", "<function=", _v3_1_block),
    opener=lambda name: "<function=" + (name + ">" if name else ""),
    grammar=json_grammar(">", "</function>", between="<function="))


def _v3_2_split(rest: str, partial: bool, tools=None) -> list:
    """`all\\ncontent` or `NAME\\n{args}` messages, further ones after `>>>`."""
    items: list = []
    pos = 0
    while pos <= len(rest):
        nl = rest.find("\n", pos)
        if nl < 0:
            head = rest[pos:]
            if partial:
                return items
            if not items:
                return [rest]
            items.append(rest[pos:])
            return items
        recipient = rest[pos:nl].strip()
        nxt = rest.find(">>>", nl)
        end = len(rest) if nxt < 0 else nxt
        body = rest[nl + 1:end]
        if recipient == "all":
            items.append(hold(body, ">>>") if partial and nxt < 0 else body)
        else:
            got = json_call(recipient, rest, nl + 1, "", partial)
            if got == INVALID or not recipient:
                if not items:
                    return [rest]
                items.append(rest[pos:])
                return items
            call, e = got
            items.append(call)
            if e is None:
                return items
            if nxt < 0:
                items.append(rest[e:])
        if nxt < 0:
            return items
        pos = nxt + 3
    return items


FUNCTIONARY_V3_2 = Dialect(
    "functionary_v3_2", lambda src: ">>>all" in src, _v3_2_split,
    opener=lambda name: name + "\n" if name else "",
    grammar=json_grammar("\n", "", between=">>>"), reads_without_tools=True)

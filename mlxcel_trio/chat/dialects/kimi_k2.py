"""Kimi K2 / K2 Thinking: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0
<|tool_call_argument_begin|>{...}<|tool_call_end|><|tool_calls_section_end|>`; the
written id (`functions.NAME:0`) is the call's id."""

from __future__ import annotations

from .base import (INVALID, UNDECIDED, Dialect, ToolCall, json_call, json_grammar, marked,
                   read_name, skip_ws, hold)

SECTION, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL, ARG, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"


def _name_of(written: str) -> str:
    name = written.removeprefix("functions.")
    return name.rsplit(":", 1)[0] if ":" in name else name


def _block(s: str, j: int, partial: bool, tools):
    calls: list[ToolCall] = []
    while True:
        k = skip_ws(s, j)
        if calls and s.startswith(SECTION_END, k):
            return calls, k + len(SECTION_END)
        if not s.startswith(CALL, k):
            tail = s[k:]
            if partial and (CALL.startswith(tail) or (calls and SECTION_END.startswith(tail))):
                return (calls, None) if calls else UNDECIDED
            return (calls, k if tail or partial else None) if calls else INVALID
        got = read_name(s, k + len(CALL), ARG, partial)
        if got in (UNDECIDED, INVALID):
            return (calls, None if partial else k) if calls else got
        written, v = got
        got = json_call(_name_of(written), s, v, CALL_END, partial)
        if got == INVALID:
            return (calls, k) if calls else INVALID
        call, j = got
        calls.append(ToolCall(call.name, call.arguments, written, complete=call.complete))
        if j is None:
            return calls, None


def opener(name: str | None) -> str:
    return SECTION + CALL + "functions." + (name + ":0" + ARG if name else "")


DIALECT = Dialect("kimi_k2", lambda src: SECTION in src and CALL in src,
                  marked("kimi_k2", SECTION, _block), opener=opener,
                  grammar=json_grammar(":0" + ARG, CALL_END + SECTION_END))

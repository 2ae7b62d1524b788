"""Kimi K2 / K2 Thinking: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0
<|tool_call_argument_begin|>{...}<|tool_call_end|><|tool_calls_section_end|>`; the
written id (`functions.NAME:0`) is the call's id."""

from __future__ import annotations

from .base import Dialect, json_grammar, json_section, marked

SECTION, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL, ARG, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"


def _name_of(written: str) -> str:
    name = written.removeprefix("functions.")
    return name.rsplit(":", 1)[0] if ":" in name else name


_block = json_section(CALL, ARG, CALL_END, SECTION_END, name_of=_name_of)


def opener(name: str | None) -> str:
    return SECTION + CALL + "functions." + (name + ":0" + ARG if name else "")


DIALECT = Dialect("kimi_k2", lambda src: SECTION in src and CALL in src,
                  marked("kimi_k2", SECTION, _block), opener=opener, fixed_think=True,
                  grammar=json_grammar(":0" + ARG, CALL_END + SECTION_END))

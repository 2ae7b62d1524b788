"""Qwen3-Coder XML (also Qwen 3.5, Nemotron Nano 3, StepFun 3.5):
`<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>`."""

from __future__ import annotations

from .base import Dialect, invoke_block, marked, tag_grammar

OPEN = "<tool_call>"
_BLOCK = invoke_block("<function=", ">", "<parameter=", ">", "</parameter>", "</function>",
                      "</tool_call>", many=False, lag=True)


def detect(src: str) -> bool:
    return OPEN in src and "<function=" in src and "<parameter=" in src


def opener(name: str | None) -> str:
    return OPEN + "\n<function=" + (name + ">\n" if name else "")


DIALECT = Dialect(
    "qwen3_coder", detect, marked("qwen3_coder", OPEN, _BLOCK), opener=opener,
    grammar=tag_grammar(">\n", "<parameter=", ">\n", "\n</parameter>\n",
                        "</function>\n</tool_call>", between="\n<tool_call>\n<function="),
    drops_after_calls=True, calls_end_thoughts=(OPEN,))

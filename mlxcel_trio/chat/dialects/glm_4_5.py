"""GLM 4.5-4.7: `<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n</tool_call>`
(4.7 writes no newlines)."""

from __future__ import annotations

from .base import INVALID, UNDECIDED, Dialect, marked, read_name, tag_grammar, tagged_params

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def _block(s: str, j: int, partial: bool, tools):
    # the name ends at a newline, the first key, or the close
    stops = [k for k in (s.find("\n", j), s.find("<arg_key>", j), s.find(CLOSE, j)) if k >= 0]
    if not stops:
        got = read_name(s, j, "\n", partial, also=("<arg_key>", CLOSE))
        return got if got in (UNDECIDED, INVALID) else INVALID
    stop = min(stops)
    got = read_name(s[:stop] + "\n", j, "\n", partial)
    if got in (UNDECIDED, INVALID):
        return got
    name = got[0]
    got = tagged_params(s, stop, name, tools, "<arg_key>", "</arg_key>", "</arg_value>", CLOSE,
                        partial, value_open="<arg_value>", lag=True)
    if got == INVALID:
        return INVALID
    call, end = got
    return [call], end


def detect(src: str) -> bool:
    return OPEN in src and "<arg_key>" in src


def opener(name: str | None) -> str:
    return OPEN + (name + "\n" if name else "")


DIALECT = Dialect("glm_4_5", detect, marked("glm_4_5", OPEN, _block), opener=opener,
                  grammar=tag_grammar("\n", "<arg_key>", "</arg_key>\n<arg_value>",
                                      "</arg_value>\n", CLOSE, between="\n" + OPEN))

"""GLM 4.5-4.7: `<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n</tool_call>`
(4.7 writes no newlines)."""

from __future__ import annotations

import attrs

from .base import INVALID, UNDECIDED, Dialect, marked, read_name, tag_grammar, tagged_params

OPEN, CLOSE = "<tool_call>", "</tool_call>"
VALUE_CLOSE = "</arg_value>"


def _block_of(compact: bool):
    """The call block as upstream's autoparser streams it: where the template
    writes a newline after `</arg_key>` and `</arg_value>` (4.5, 4.6) a key
    or a value's close counts once something follows; where it writes none
    (4.7), at once.  String values are read as written."""

    def block(s: str, j: int, partial: bool, tools):
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
        if partial and not compact and s.endswith(VALUE_CLOSE):
            s = s[:-1]
        got = tagged_params(s, stop, name, tools, "<arg_key>", "</arg_key>", VALUE_CLOSE, CLOSE,
                            partial, value_open="<arg_value>", lag=True, key_lag=not compact,
                            raw=True)
        if got == INVALID:
            return INVALID
        call, end = got
        return [call], end
    return block


def detect(src: str) -> bool:
    return OPEN in src and "<arg_key>" in src


def opener(name: str | None) -> str:
    return OPEN + (name + "\n" if name else "")


DIALECT = Dialect("glm_4_5", detect, marked("glm_4_5", OPEN, _block_of(False)), opener=opener,
                  settles=False, raw_thoughts=True,
                  grammar=tag_grammar("\n", "<arg_key>", "</arg_key>\n<arg_value>",
                                      "</arg_value>\n", CLOSE, between="\n" + OPEN))
# 4.7 forces its calls as its template renders them: no newline after the name or any tag
_COMPACT = attrs.evolve(DIALECT, split=marked("glm_4_5", OPEN, _block_of(True)),
                        opener=lambda name: OPEN + (name or ""),
                        grammar=tag_grammar("", "<arg_key>", "</arg_key><arg_value>",
                                            "</arg_value>", CLOSE, between=OPEN))


def variant(dialect: Dialect, src: str) -> Dialect:
    """GLM 4.7's template writes its tags with no newline between them."""
    return _COMPACT if dialect is DIALECT and "</arg_key><arg_value>" in src else dialect

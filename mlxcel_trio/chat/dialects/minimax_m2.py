"""MiniMax M2: `<minimax:tool_call>\n<invoke name="NAME">\n<parameter name="K">V</parameter>\n
</invoke>\n</minimax:tool_call>` (several invokes in one block); M3 writes its
`]<]minimax[>[` namespace before each tag."""

from __future__ import annotations

from .base import Dialect, invoke_block, marked, tag_grammar

OPEN, CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
NS = "]<]minimax[>["

_M2 = invoke_block('<invoke name="', '">', '<parameter name="', '">', "</parameter>",
                   "</invoke>", CLOSE)
_M3 = invoke_block(NS + '<invoke name="', '">', NS + '<parameter name="', '">',
                   NS + "</parameter>", NS + "</invoke>", NS + "</tool_call>", lag=True)


def opener(name: str | None) -> str:
    return OPEN + '\n<invoke name="' + (name + '">\n' if name else "")


def m3_opener(name: str | None) -> str:
    return NS + "<tool_call>" + NS + '<invoke name="' + (name + '">' if name else "")


DIALECT = Dialect(
    "minimax_m2", lambda src: OPEN in src, marked("minimax_m2", OPEN, _M2), opener=opener,
    grammar=tag_grammar('">\n', '<parameter name="', '">', "</parameter>\n",
                        "</invoke>\n" + CLOSE))
M3 = Dialect(
    "minimax_m3", lambda src: NS in src and "<tool_call>" in src and "<invoke name=" in src,
    marked("minimax_m3", NS + "<tool_call>", _M3), opener=m3_opener,
    grammar=tag_grammar('">', NS + '<parameter name="', '">', NS + "</parameter>",
                        NS + "</invoke>\n" + NS + "</tool_call>"))

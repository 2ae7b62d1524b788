"""MiniMax M2: `<minimax:tool_call>\n<invoke name="NAME">\n<parameter name="K">V</parameter>\n
</invoke>\n</minimax:tool_call>` (several invokes in one block); M3 is in
minimax_m3.py."""

from __future__ import annotations

from .base import Dialect, invoke_block, marked, tag_grammar

OPEN, CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"

# partial calls as upstream's autoparser streams them: a marker counts once
# the newline the template writes after it follows, a key once its quote closes
_M2 = invoke_block('<invoke name="', '">', '<parameter name="', '">', "</parameter>",
                   "</invoke>", CLOSE, lag=True, key_lag=False, key_end='"', raw=True)


def opener(name: str | None) -> str:
    return OPEN + '\n<invoke name="' + (name + '">\n' if name else "")


DIALECT = Dialect(
    "minimax_m2", lambda src: OPEN in src, marked("minimax_m2", OPEN, _M2), opener=opener,
    settles=False, raw_thoughts=True, opener_blank=False,
    grammar=tag_grammar('">\n', '<parameter name="', '">', "</parameter>\n",
                        "</invoke>\n" + CLOSE))

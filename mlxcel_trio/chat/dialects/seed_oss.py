"""ByteDance Seed-OSS: `<seed:think>` thoughts; calls as
`<seed:tool_call>\n<function=NAME>\n<parameter=KEY>VALUE</parameter>\n</function>\n</seed:tool_call>`."""

from __future__ import annotations

from .base import Dialect, invoke_block, marked, tag_grammar

OPEN = "<seed:tool_call>"
# partial calls as upstream's autoparser streams them: a name or a value's
# close counts once the newline the template writes after it follows, a key
# at its `>`; string values as written
_BLOCK = invoke_block("<function=", ">", "<parameter=", ">", "</parameter>", "</function>",
                      "</seed:tool_call>", many=False, lag=True,
                      key_lag=False, raw=True)


def opener(name: str | None) -> str:
    return OPEN + "\n<function=" + (name + ">\n" if name else "")


DIALECT = Dialect(
    "seed_oss", lambda src: OPEN in src or "<seed:think>" in src,
    marked("seed_oss", OPEN, _BLOCK), think=("<seed:think>", "</seed:think>"), opener=opener,
    settles=False,
    grammar=tag_grammar(">\n", "<parameter=", ">", "</parameter>\n",
                        "</function>\n</seed:tool_call>",
                        between="\n<seed:tool_call>\n<function="))

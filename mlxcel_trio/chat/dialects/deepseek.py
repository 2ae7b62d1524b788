"""DeepSeek: R1's and V3.1's `<｜tool▁calls▁begin｜>` sections (R1 writes
`function<｜tool▁sep｜>NAME` and the arguments in a json fence, V3.1
`NAME<｜tool▁sep｜>{args}`), and V3.2 / V4's DSML tags
(`<｜DSML｜function_calls>` / `<｜DSML｜tool_calls>`)."""

from __future__ import annotations

import json

from .base import (INVALID, UNDECIDED, Dialect, ToolCall, args_object, hold, json_grammar,
                   json_section, marked, read_name, skip_ws, tag_grammar)

CALLS, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
FENCE = "\n```json\n"

_V3_1 = json_section(CALL, SEP, CALL_END, CALLS_END)
_R1 = json_section(CALL, FENCE, "\n```" + CALL_END, CALLS_END, pre_name="function" + SEP)


def _is_r1(src: str) -> bool:
    return CALLS in src and "```json" in src


def r1_opener(name: str | None) -> str:
    return CALLS + CALL + "function" + SEP + (name + FENCE if name else "")


def v3_1_opener(name: str | None) -> str:
    return CALLS + CALL + (name + SEP if name else "")


R1 = Dialect("deepseek_r1", _is_r1, marked("deepseek_r1", CALLS, _R1), opener=r1_opener,
             raw_thoughts=True,
             grammar=json_grammar(FENCE, "\n```" + CALL_END + CALLS_END))
V3_1 = Dialect("deepseek_v3_1", lambda src: CALLS in src and not _is_r1(src),
               marked("deepseek_v3_1", CALLS, _V3_1), opener=v3_1_opener, raw_thoughts=True,
               grammar=json_grammar(SEP, CALL_END + CALLS_END))

# -- DSML (V3.2, V4) -------------------------------------------------------------------------

D = "｜DSML｜"


def _dsml_block(section: str):
    close = "</" + D + section + ">"
    inv, inv_close = "<" + D + 'invoke name="', "</" + D + "invoke>"
    param, param_close = "<" + D + 'parameter name="', "</" + D + "parameter>"

    def block(s: str, j: int, partial: bool, tools):
        calls: list[ToolCall] = []
        while True:
            k = skip_ws(s, j)
            if calls and s.startswith(close, k):
                return calls, k + len(close)
            if not s.startswith(inv, k):
                tail = s[k:]
                if partial and (inv.startswith(tail) or (calls and close.startswith(tail))):
                    return (calls, None) if calls else UNDECIDED
                return (calls, k if tail or partial else None) if calls else INVALID
            got = read_name(s, k + len(inv), '">', partial)
            offered = [t["function"].get("name", "") for t in tools or ()
                       if isinstance(t, dict) and isinstance(t.get("function"), dict)]
            if offered and (got == UNDECIDED and not any(
                    n.startswith(hold(s[k + len(inv):], '">')) for n in offered)
                    or isinstance(got, tuple) and got[0] not in offered):
                got = INVALID  # not (the start of) an offered tool's name, as upstream's
            if got in (UNDECIDED, INVALID):
                return (calls, None if partial else k) if calls else got
            name, v = got
            if partial and v >= len(s):
                # as upstream's stream: the name counts once something follows it
                return (calls, None) if calls else UNDECIDED
            pairs: list[tuple[str, str]] = []
            while True:
                v = skip_ws(s, v)
                if s.startswith(inv_close, v):
                    calls.append(ToolCall(name, args_object(pairs, True)))
                    j = v + len(inv_close)
                    break
                if not s.startswith(param, v):
                    tail = s[v:]
                    if partial and (param.startswith(tail) or inv_close.startswith(tail)) \
                            or not tail:
                        calls.append(ToolCall(name, args_object(pairs, not partial),
                                              complete=False))
                        return calls, None
                    return (calls, k) if calls else INVALID
                he = s.find('">', v)
                ve = s.find(param_close, he) if he >= 0 else -1
                if ve < 0:
                    args = args_object(pairs, False)  # a call cut short stays open
                    key, _, attrs_ = s[v + len(param):max(he, v)].partition('"')
                    if partial and he >= 0:
                        # a value streams as written (`{"city":"Pari`, `{"n":1`)
                        so_far = hold(s[he + 2:], param_close)
                        so_far = json.dumps(so_far, ensure_ascii=False)[:-1] \
                            if 'string="true' in attrs_ else so_far.strip()
                        args += ("," if pairs else "") + json.dumps(key, ensure_ascii=False) \
                            + ":" + so_far
                    calls.append(ToolCall(name, args, complete=False))
                    return calls, None
                key, _, attrs_ = s[v + len(param):he].partition('"')
                value = s[he + 2:ve]
                pairs.append((key, json.dumps(value, ensure_ascii=False)
                              if 'string="true' in attrs_ else value.strip()))
                v = ve + len(param_close)
    return block


def _dsml_split(rest: str, partial: bool, tools=None) -> list:
    for section in ("tool_calls", "function_calls"):
        if "<" + D + section + ">" in rest:
            # the blank lines the template writes before the section are its
            # own, as upstream's grammar reads them
            opener = "<" + D + section + ">"
            opener = "\n\n" + opener if "\n\n" + opener in rest else opener
            return marked("deepseek_dsml", opener, _dsml_block(section))(rest, partial, tools)
    opens = ("<" + D + "tool_calls>", "<" + D + "function_calls>")
    return [hold(rest, *opens, *DSML_SECTIONS) if partial else rest]


# the section as upstream's grammar expects it, blank lines first
DSML_SECTIONS = ("\n\n<" + D + "function_calls>", "\n\n<" + D + "tool_calls>")


def _dsml_section(src: str) -> str:
    return "tool_calls" if D + "tool_calls" in src or "'tool_calls>'" in src \
        and "function_calls" not in src else "function_calls"


def dsml_opener(name: str | None) -> str:
    return "<" + D + "function_calls>\n<" + D + 'invoke name="' + (name + '">\n' if name else "")


DSML = Dialect(
    "deepseek_dsml",
    lambda src: "dsml_token" in src and "DSML" in src and (
        "function_calls" in src or "tool_calls" in src),
    _dsml_split, opener=dsml_opener,
    calls_end_thoughts=DSML_SECTIONS,
    grammar=tag_grammar('">\n', "<" + D + 'parameter name="', '" string="true">',
                        "</" + D + "parameter>\n",
                        "</" + D + "invoke>\n</" + D + "function_calls>",
                        key_close_json='" string="false">'))


def dsml_variant(dialect: Dialect, src: str) -> Dialect:
    """V4 names its block `tool_calls` (V3.2 `function_calls`): a forced call
    opens the block the template teaches."""
    if dialect is not DSML or "function_calls" in src:
        return dialect
    import attrs
    return attrs.evolve(DSML, opener=lambda name: dsml_opener(name).replace(
        "function_calls", "tool_calls"), grammar=_v4_grammar)


_v4_grammar = tag_grammar('">\n', "<" + D + 'parameter name="', '" string="true">',
                          "</" + D + "parameter>\n", "</" + D + "invoke>\n</" + D + "tool_calls>",
                          key_close_json='" string="false">')

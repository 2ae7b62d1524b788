"""The generic dialect: for a template outside the table, the call wrapper
is read off the template's own rendering of an assistant tool call, as
upstream's auto-parser derives it.  A probe call is rendered; the text
between the assistant turn's start and the probe's name is the opener, and
the call is read as Hermes-style JSON (`{"name": ..., "arguments": ...}`)
or as `NAME SEP {args}` after that opener, whichever the rendering shows."""

from __future__ import annotations

import json

from .base import Dialect, json_call, json_grammar, json_list, marked, read_name, INVALID, \
    UNDECIDED

PROBE, ARG = "probe_fn_xq", {"probe_arg": "probe_value"}
PLACEHOLDER = Dialect("generic", lambda src: False)


def _render(source: str) -> str | None:
    from ..template import ChatTemplate
    user = {"role": "user", "content": "hi"}
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": PROBE, "arguments": json.dumps(ARG)}}]}
    try:
        return ChatTemplate(source, {}).render([user, call], add_generation_prompt=False)
    except Exception:  # noqa: BLE001 - a template that cannot render a call teaches none
        return None


def derive(source: str) -> Dialect | None:
    if "tool_calls" not in source:
        return None
    out = _render(source)
    if out is None or PROBE not in out:
        return None
    at = out.index(PROBE)
    # the opener: the marker-looking text just before the call (after the
    # last blank run), e.g. `<tool_call>\n{"name": "` or `[CALL]`
    before = out[:at]
    line_start = max(before.rfind("\n\n"), before.rfind("hi")) + 1
    head = before[line_start:].lstrip()
    json_head = head.rstrip().endswith('"name": "')
    marker = head[:head.find("{")] if json_head else head
    marker = marker.strip()
    if not marker:
        return None
    after = out[at + len(PROBE):]
    if json_head:
        return Dialect("generic", lambda src: True, marked("generic", marker,
                                                          json_list(bracket=False)),
                       none_is_flat=False)
    sep = after[:after.find("{")] if "{" in after else ""
    if not sep.strip():
        return None

    def block(s, j, partial, tools):
        got = read_name(s, j, sep, partial)
        if got in (UNDECIDED, INVALID):
            return got
        name, v = got
        got = json_call(name, s, v, "", partial)
        return got if got == INVALID else ([got[0]], got[1])

    return Dialect("generic", lambda src: True, marked("generic", marker, block),
                   opener=lambda name: marker + (name + sep if name else ""),
                   grammar=json_grammar(sep, ""), none_is_flat=False)

"""The generic dialect: for a template outside the table, the call wrapper
is read off the template's own rendering of an assistant tool call, as
upstream's auto-parser derives it.  A probe call is rendered; the text
between the assistant turn's start and the probe's name is the opener, and
the call is read as Hermes-style JSON (`{"name": ..., "arguments": ...}`)
or as `NAME SEP {args}` after that opener, whichever the rendering shows."""

from __future__ import annotations

import json
import re

import attrs

from .base import Dialect, json_call, json_grammar, json_list, marked, read_name, INVALID, \
    UNDECIDED

PROBE, ARG = "probe_fn_xq", {"probe_arg": "probe_value"}
PROBE_TEXT = "probe_text_xq"
PLACEHOLDER = Dialect("generic", lambda src: False)


def _render(source: str, content: str | None = None) -> str | None:
    """The template's rendering of a probe call (or, given `content`, of a
    plain answer in the same place)."""
    from ..template import ChatTemplate
    user = {"role": "user", "content": "hi"}
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": PROBE, "arguments": json.dumps(ARG)}}]}
    if content is not None:
        call = {"role": "assistant", "content": content}
    try:
        return ChatTemplate(source, {}).render([user, call], add_generation_prompt=False)
    except Exception:  # noqa: BLE001 - a template that cannot render a call teaches none
        return None


def _turn_start(source: str, out: str, at: int) -> int:
    """Where the assistant's own text starts in the probe call's rendering:
    the end of what it shares with a plain answer's (upstream's autoparser
    reads the wrapper off the same difference); -1 when that says nothing."""
    plain = _render(source, PROBE_TEXT)
    if plain is None or PROBE_TEXT not in plain:
        return -1
    n = 0
    while n < min(len(out), len(plain)) and out[n] == plain[n]:
        n += 1
    for open_, close in ("<>", "[]"):  # not inside a marker both start alike (`<|tool_calls|>`)
        k = out.rfind(open_, 0, n)
        if k > out.rfind(close, 0, n):
            n = k
    return n if n <= at and n <= plain.index(PROBE_TEXT) else -1


_MARK_BEFORE, _MARK_AFTER = re.compile(r"<\|[^|<>\s]+\|>$"), re.compile(r"^<\|[^|<>\s]+\|>")


def _content_wrap(source: str) -> tuple[str, str] | None:
    """Markers the template writes right around a plain answer (Solar Open's
    `<|content|>...<|end|>`), which upstream's autoparser takes off it."""
    plain = _render(source, PROBE_TEXT)
    if plain is None or PROBE_TEXT not in plain:
        return None
    i = plain.index(PROBE_TEXT)
    before, after = _MARK_BEFORE.search(plain[:i]), _MARK_AFTER.search(plain[i + len(PROBE_TEXT):])
    return (before.group(0), after.group(0)) if before and after else None


def derive(source: str) -> Dialect | None:
    found = _derive(source)
    wrap = _content_wrap(source) if found is not None else None
    return found if wrap is None else attrs.evolve(found, content_wrap=wrap, unwraps_with_tools=False)


def _derive(source: str) -> Dialect | None:
    if "tool_calls" not in source:
        return None
    out = _render(source)
    if out is None or PROBE not in out:
        return None
    at = out.index(PROBE)
    # the opener: the text the assistant's turn starts the call with, e.g.
    # `<tool_call>\n{"name": "` or `[CALL]`; else the marker-looking text
    # just before the call (after the last blank run)
    before = out[:at]
    line_start = _turn_start(source, out, at)
    if line_start < 0:
        line_start = max(before.rfind("\n\n"), before.rfind("hi")) + 1
    head = before[line_start:].lstrip()
    json_head = head.rstrip().endswith('"name": "')
    marker = head[:head.find("{")] if json_head else head
    marker = marker.strip()
    if not marker:
        return None
    after = out[at + len(PROBE):]
    if json_head:
        # a tag that opens the calls closes them where the template writes
        # its closing twin after them (MiniMax-M1's `<tool_calls>` list)
        twin = "</" + marker[1:] if marker.startswith("<") and not marker.startswith("</") else ""
        close = twin if twin and twin in after else ""
        return Dialect("generic", lambda src: True, marked("generic", marker,
                                                          json_list(close, bracket=False)),
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

"""Muse Glimmer (ATEM): the output is a run of messages `HEADER<|message|>BODY`
joined by `<|eom|><|start|>assistant` (the generation prompt wrote the first
`<|start|>assistant`; `<|eot|>` ends the turn).  The header names the
recipient: ` to=self` is the reasoning, ` to=user` (or none) the answer, and
` to=NAME` a call whose body is one `<atem:function_calls>` block:
`<atem:invoke name="NAME">` then `<atem:parameter name="K">V</atem:parameter>`
per argument (a string as written, anything else as JSON).

As upstream's handler reads it: a call counts once its invoke name is
closed, a parameter once its key is, and its closing brace waits for the
block's close; a header other than those (blank lines before it included)
is no message, so the output fails to parse and stays content."""

from __future__ import annotations

from .base import INVALID, UNDECIDED, Dialect, Parsed, ToolCall, hold, read_name, soft_failure, \
    tag_grammar, tagged_params
from ..jsonscan import skip_ws

MESSAGE, EOM, EOT = "<|message|>", "<|eom|>", "<|eot|>"
NEXT = EOM + "<|start|>assistant"
TO, SELF, USER = " to=", "self", "user"
BLOCK, BLOCK_CLOSE = "<atem:function_calls>", "</atem:function_calls>"
INVOKE, PARAM, PARAM_CLOSE = '<atem:invoke name="', '<atem:parameter name="', "</atem:parameter>"
INVOKE_CLOSE = "</atem:invoke>"


def _call(s: str, j: int, partial: bool, tools):
    """The one invoke of a `<atem:function_calls>` block from `s[j]`: (call,
    whether the block closed), UNDECIDED or INVALID.  Upstream's stream: a
    value as written from its key's close (a string with its blanks), no
    closing brace before the block closes."""
    k = skip_ws(s, j)
    if not s.startswith(INVOKE, k):
        return UNDECIDED if partial and INVOKE.startswith(s[k:]) else INVALID
    got = read_name(s, k + len(INVOKE), '">', partial)
    if got in (UNDECIDED, INVALID):
        return got
    name, v = got
    got = tagged_params(s, v, name, tools, PARAM, '">', PARAM_CLOSE, INVOKE_CLOSE, partial,
                        lag=True, key_lag=False, raw=True)
    if got == INVALID:
        return INVALID
    call, end = got
    if end is not None and s.startswith(BLOCK_CLOSE, skip_ws(s, end)):
        return call, True
    return ToolCall(call.name, call.arguments.removesuffix("}"), complete=False), False


def message(text: str, partial: bool, reasoning: bool = True, thinking_open: bool = False,
            tools=None) -> Parsed:
    if not reasoning and tools is None:
        return Parsed(content=text)  # upstream reads the whole output as content
    content: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    offered = {t["function"]["name"] for t in tools or () if isinstance(t.get("function"), dict)}
    pos = 0
    while pos < len(text):
        m = text.find(MESSAGE, pos)
        header = text[pos:m] if m >= 0 else text[pos:]
        if header and not header.startswith(TO):
            if partial and TO.startswith(header):
                break
            return _failed(content, thoughts, text, pos, partial)
        if m < 0:  # a header still arriving
            if not partial:
                return _failed(content, thoughts, text, pos, partial)
            break
        recipient = header[len(TO):]
        b = m + len(MESSAGE)
        ends = sorted((i, e) for e in (EOM, EOT) if (i := text.find(e, b)) >= 0)
        e_at, end = ends[0] if ends else (len(text), "")
        body = text[b:e_at]
        if recipient in ("", SELF, USER):
            if calls:
                break  # upstream's reads only calls after a call: the rest is dropped
            if partial and not end:
                body = hold(body, EOM, EOT)
            (thoughts if recipient == SELF and reasoning else content).append(body)
        elif tools is None:  # no tools offered: upstream reads no call message
            return _failed(content, thoughts, text, pos, partial, calls)
        else:
            got = _call(text[:e_at], b + len(BLOCK), partial and not end, tools) \
                if text.startswith(BLOCK, b) else UNDECIDED if BLOCK.startswith(text[b:e_at]) \
                else INVALID
            if got == UNDECIDED and partial and not end:
                break
            if got in (UNDECIDED, INVALID) or offered and got[0].name not in offered:
                return _failed(content, thoughts, text, pos, partial, calls)
            calls.append(got[0])
        if end != EOM:
            break
        if not text.startswith(NEXT, e_at):
            break  # the next message's start is still arriving (or never comes)
        pos = e_at + len(NEXT)
    return Parsed("".join(content), "".join(thoughts), tuple(calls))


def _failed(content, thoughts, text: str, pos: int, partial: bool, calls=()) -> Parsed:
    """Output upstream cannot read: what was read stands (a call once named
    stays a call); at the end the rest is content (said once)."""
    if partial:
        return Parsed("".join(content), "".join(thoughts), tuple(calls))
    soft_failure("muse_glimmer", text[pos:])
    return Parsed("".join(content) + text[pos:], "".join(thoughts), tuple(calls))


def opener(name: str | None) -> str:
    return TO + (_head(name) if name else "")


def _head(name: str) -> str:
    return f'{name}{MESSAGE}{BLOCK}\n{INVOKE}{name}">\n'


DIALECT = Dialect("muse_glimmer", lambda src: BLOCK in src and EOM in src, message=message,
                  opener=opener, fixed_think=True, settles=False, think=(TO + SELF + MESSAGE, NEXT),
                  thought=(TO + SELF + MESSAGE, NEXT),
                  grammar=tag_grammar('">\n', PARAM, '">', PARAM_CLOSE + "\n",
                                      "</atem:invoke>\n" + BLOCK_CLOSE, between=NEXT + TO,
                                      head_of=_head))

"""GPT-OSS Harmony: the output is a run of messages
`<|channel|>CHANNEL[ to=functions.NAME][ <|constrain|>json]<|message|>BODY<|end|>`
joined by `<|start|>assistant`; `analysis` is the reasoning, `final` (and a
`commentary` without a recipient, a preamble) the content, and a message
to `functions.NAME` a call whose body is its JSON arguments (ended by
`<|call|>`).  The recipient may also stand before the channel."""

from __future__ import annotations

import re

from .base import Dialect, Parsed, ToolCall, hold, json_grammar

CHANNEL, MESSAGE, START = "<|channel|>", "<|message|>", "<|start|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_TO = re.compile(r"to=([^\s<]+)")


def message(text: str, partial: bool, reasoning: bool = True, thinking_open: bool = False,
            tools=None) -> Parsed:
    content: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    pos = 0
    while pos < len(text):
        if text.startswith(START, pos):
            # `<|start|>assistant` between messages
            h = text.find(CHANNEL, pos)
            head_end = text.find(MESSAGE, pos)
            if h < 0 and head_end < 0:
                if not partial:
                    content.append(text[pos:])
                break
        m = text.find(MESSAGE, pos)
        if m < 0:
            if not partial:
                rest = text[pos:]
                if CHANNEL not in rest and START not in rest:
                    content.append(rest)
            elif CHANNEL not in text[pos:] and not any(
                    x.startswith(text[pos:]) for x in (CHANNEL, START)) and not calls \
                    and not thoughts and pos == 0:
                content.append(hold(text[pos:], CHANNEL, START))
            break
        header = text[pos:m]
        ch = _CHANNEL.search(header)
        to = _TO.search(header)
        channel = ch.group(1) if ch else ""
        b = m + len(MESSAGE)
        ends = [(text.find(e, b), e) for e in ENDS]
        ends = [(i, e) for i, e in ends if i >= 0]
        if ends:
            e_at, e = min(ends)
            body, pos, closed = text[b:e_at], e_at + len(e), True
        else:
            body, pos, closed = text[b:], len(text), False
            if partial:
                body = hold(body, *ENDS, START)
        if to and to.group(1).startswith("functions."):
            args = body.strip() if closed or not partial else body.lstrip()
            calls.append(ToolCall(to.group(1)[len("functions."):], args or "{",
                                  complete=closed))
        elif channel == "analysis":
            if reasoning:
                thoughts.append(body)
            else:
                content.append(text[text.rfind(CHANNEL, 0, m) if ch else b - len(MESSAGE):pos])
        else:
            content.append(body)
    return Parsed(content="".join(content), reasoning_content="".join(thoughts),
                  tool_calls=tuple(calls))


def opener(name: str | None) -> str:
    return CHANNEL + "commentary to=functions." + (name + " <|constrain|>json" + MESSAGE
                                                   if name else "")


DIALECT = Dialect("gpt_oss", lambda src: CHANNEL in src, message=message, opener=opener,
                  fixed_think=True,
                  thought=(CHANNEL + "analysis" + MESSAGE, "<|end|>" + START + "assistant"),
                  grammar=json_grammar(" <|constrain|>json" + MESSAGE, ""))

"""From generated text to a chat message: reasoning, content, tool calls.

Theory of operation: `parse(text, syntax, partial)` is a pure function of
everything generated so far.  A streaming response re-parses after every
token and sends the difference from the previous parse (`ChatStream`), so
the streamed deltas concatenate to the final message by construction, as
long as a partial parse is always a prefix of every later parse.  That is
the one rule this module keeps, and it is why a partial parse holds text
back whenever the text could still turn into something else:

* the start of the output while it could still become the thinking opener;
* a tail of the thoughts that could be the start of the closing marker;
* a tail of the content that could be the start of a tool-call marker, and
  (with tools) trailing blanks, which are dropped next to a tool call;
* a tool call until its name is complete (from then on it is a call, even
  if the output ends before the call does, so a call is never reported
  first as content and then as a call, or the other way round).

Placement (`--reasoning-format`), with thoughts = the text between the
markers, and answer = the text after the closing marker, tool calls removed:

    none             content = the output as generated (markers included)
    deepseek, auto   reasoning_content = thoughts, trimmed;
                     content = answer, leading blanks trimmed
    deepseek-legacy  reasoning_content = thoughts, trimmed;
                     content = "<think>" + thoughts + "</think>" + answer

A thinking block is recognised at the very start of the output (after
blanks), or from the first byte when the prompt left one open (the
template primed it).  Tool calls are parsed only in the answer.
"""

from __future__ import annotations

import re
import secrets
import string
from typing import Any

import attrs

from .dialects.base import THINK_MARKERS, ToolCall, held_suffix, hold, soft_failure
from .dialects.table import lookup
from .jsonscan import skip_ws


REASONING_FORMATS = ("none", "deepseek", "deepseek-legacy", "auto")


@attrs.frozen
class Syntax:
    """How one request's output is read."""

    reasoning_format: str = "auto"
    thinking_open: bool = False       # the prompt left a thinking block open
    think_start: str = "<think>"
    think_end: str = "</think>"
    tool_format: Any = None           # a dialect or its name (chat/dialects); None: no calls
    tools: tuple = attrs.field(default=(), eq=False)  # the request's, typing tagged parameters
    calls: bool = True                # False: the request offered no tools, nothing is a call
    raw_partials: bool = False        # partial thoughts keep their blanks (upstream's parse)
    opener: str = ""                  # the prompt's open thinking marker, put back under "none"
    closed_think: bool = False        # the prompt closed an empty thinking block (thinking off)
    skip: bool = False                # --skip-chat-parsing: everything is content


@attrs.frozen
class ChatMsg:
    content: str = ""
    reasoning_content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


# -- tool calls ----------------------------------------------------------------------------

def _dialect(syntax: Syntax):
    return lookup(syntax.tool_format)


def _unwrap(rest: str, wrap: tuple[str, str] | None, partial: bool) -> str:
    """The answer without a content wrapper's markers (Command R7B's
    <|START_RESPONSE|>...<|END_RESPONSE|>): each opener with the first close
    after it; a close outside a wrapper is text, as upstream reads it."""
    if wrap is None:
        return rest
    start, end = wrap
    out: list[str] = []
    pos, inside = 0, False
    while (i := rest.find(start, pos)) >= 0:
        j = rest.find(end, i + len(start))
        out += [rest[pos:i], rest[i + len(start):j if j >= 0 else len(rest)]]
        pos, inside = (j + len(end), False) if j >= 0 else (len(rest), True)
    text = "".join(out) + rest[pos:]
    # a partial holds what may still start the wrapper's marker due next
    return hold(text, end if inside else start) if partial else text


def _split_tools(rest: str, syntax: Syntax, partial: bool) -> tuple[str, tuple[ToolCall, ...]]:
    if syntax.tool_format is None:
        return rest, ()
    dialect = _dialect(syntax)
    if dialect.unwraps_with_tools or not syntax.calls:
        rest = _unwrap(rest, dialect.content_wrap, partial)
    if dialect.split is None or not (syntax.calls or dialect.reads_without_tools):
        return rest, ()
    items = dialect.split(rest, partial, syntax.tools)
    offered = {t["function"]["name"] for t in syntax.tools
               if isinstance(t, dict) and isinstance(t.get("function"), dict)}
    if dialect.drops_after_calls:  # as upstream's: what follows the calls is dropped
        last = max((k for k, item in enumerate(items) if isinstance(item, ToolCall)), default=-1)
        items = items[:last + 1] if last >= 0 else items
    texts: list[str] = []
    calls: list[ToolCall] = []
    for k, item in enumerate(items):
        if isinstance(item, ToolCall):
            if offered and item.name not in offered:
                # a call to a tool the request did not offer: upstream's parse
                # fails; here the output is content from there on (said once)
                if partial:
                    break
                soft_failure(dialect.name, item.name)
                return rest, ()
            if partial and not syntax.calls and not item.arguments:
                # no tools to check the name against (Functionary v3.2 reads
                # its recipient line without them): a line is a call only once
                # its arguments begin, else plain text would stream as a call
                break
            if partial and not item.complete and dialect.settles:
                item = attrs.evolve(item, arguments=_settled(item.arguments))
            calls.append(item)
            continue
        # as upstream: blank-only text beside a call is dropped, other text
        # keeps its blanks; a partial parse holds back only marker prefixes
        if (k + 1 < len(items) and isinstance(items[k + 1], ToolCall)
                or k > 0 and isinstance(items[k - 1], ToolCall)) and not item.strip() \
                and not dialect.blank_content:
            continue
        if k > 0 and isinstance(items[k - 1], ToolCall):
            item = item.lstrip()
        texts.append(item)
    if partial and texts and not texts[-1].strip() and not dialect.blank_content:
        texts.pop()  # blanks that may yet stand before a call
    return "".join(texts), tuple(calls)


_ESCAPE = re.compile(r"(\\+)(u[0-9a-fA-F]{0,3})?$")


def _settled(arguments: str) -> str:
    """Arriving arguments as upstream reports them: without trailing blanks
    (in a string too) nor an escape cut short."""
    out = arguments.rstrip()
    m = _ESCAPE.search(out)
    if m and len(m.group(1)) % 2 == 1:  # the last backslash opens an unfinished escape
        out = out[:m.end(1) - 1].rstrip()
    return out


# -- the message ------------------------------------------------------------------------

def parse(text: str, syntax: Syntax, partial: bool) -> ChatMsg:
    if syntax.skip:
        return ChatMsg(content=text)
    dialect = _dialect(syntax) if syntax.tool_format is not None else None
    if dialect is not None and dialect.message is not None:
        msg = dialect.message(text, partial, syntax.reasoning_format != "none",
                              syntax.thinking_open, syntax.tools if syntax.calls else None)
        calls = tuple(attrs.evolve(c, arguments=_settled(c.arguments))
                      if partial and not c.complete and dialect.settles else c
                      for c in msg.tool_calls)
        return ChatMsg(msg.content, msg.reasoning_content, calls)
    start, end = syntax.think_start, syntax.think_end
    r_start = None
    none = syntax.reasoning_format == "none"
    if syntax.closed_think or none and syntax.tool_format is not None \
            and _dialect(syntax).none_is_flat:
        # as upstream: no thinking block is read; the prompt's opener leads the
        # content (read with it, so blanks after it are text, not a call's margin)
        head = syntax.opener if none and syntax.thinking_open else ""
        if _prompt_tail(syntax):
            # upstream reads on from the prompt's close: what the prompt wrote
            # after it leads the content; otherwise the model's lead blanks go
            if syntax.closed_think:
                head = syntax.opener[syntax.opener.rfind(end) + len(end):]
            else:
                text = text.lstrip()
        content, calls = _split_tools(head + text, syntax, partial)
        return ChatMsg(content=content, tool_calls=calls)
    if not start:
        pass  # the template has no thinking block
    elif syntax.thinking_open:
        r_start = 0
    else:
        lead = skip_ws(text, 0)
        if text.startswith(start, lead):
            r_start = lead + len(start)
        elif partial and start.startswith(text[lead:]) and not (
                lead and syntax.tool_format is not None and _dialect(syntax).blank_content):
            return ChatMsg()  # could still become the opener (where the family
            # keeps blanks as content, once some lead it is not held, as upstream)
    if r_start is None:
        if _prompt_tail(syntax):
            text = text.lstrip()
        content, calls = _split_tools(text, syntax, partial)
        return ChatMsg(content=content, tool_calls=calls)

    e = text.find(end, r_start)
    closed = e >= 0
    markers = _ending_markers(syntax) if syntax.thinking_open else ()
    c = _calls_start(text, r_start, e, markers, syntax, partial) if markers else -1
    if c >= 0:  # thoughts cut short by a call section (upstream keeps their blanks)
        thoughts, rest, closed = text[r_start:c], text[c:], True
        answer, calls = _split_tools(rest, syntax, partial)
        if syntax.reasoning_format != "none":
            return ChatMsg(content=answer.lstrip(), tool_calls=calls,
                           reasoning_content=thoughts if thoughts.strip() else "")
    elif closed:
        thoughts, rest = text[r_start:e], text[e + len(end):]
    else:
        thoughts, rest = text[r_start:], ""
        if partial:
            thoughts = hold(thoughts, end, *markers)
            if markers and not thoughts.strip():
                thoughts = ""
    answer, calls = _split_tools(rest, syntax, partial) if closed else ("", ())
    fmt = syntax.reasoning_format
    if fmt == "none":
        head = text[:r_start] or (syntax.opener if syntax.thinking_open else "")
        return ChatMsg(content=head + thoughts + (end + answer if closed else ""),
                       tool_calls=calls)
    if syntax.tool_format is not None and _dialect(syntax).raw_thoughts:
        # upstream's autoparser reads the thoughts from the prompt's opener on,
        # untrimmed (blanks alone are none); a stream holds only trailing blanks back
        if syntax.thinking_open and syntax.opener.startswith(start) \
                and _dialect(syntax).opener_blank:
            thoughts = syntax.opener[len(start):] + thoughts
        reasoning = thoughts if closed or not partial or syntax.raw_partials \
            else thoughts.rstrip()
        if not reasoning.strip():
            reasoning = ""
    elif closed or not partial:
        reasoning = thoughts.strip()
    else:  # upstream's partials keep the thoughts' blanks; the server's stream trims them
        reasoning = thoughts if syntax.raw_partials else thoughts.strip()
        if syntax.tool_format is not None and _dialect(syntax).trims_thought_lead:
            reasoning = reasoning.lstrip()
    if fmt == "deepseek-legacy":
        body = start + thoughts + (end + answer if closed else "")
        return ChatMsg(content=body, reasoning_content=reasoning, tool_calls=calls)
    return ChatMsg(content=answer.lstrip(), reasoning_content=reasoning, tool_calls=calls)


def _prompt_tail(syntax: Syntax) -> bool:
    """The dialect reads the answer as upstream's autoparser does after a
    bare closing marker (Dialect.prompt_tail)."""
    return syntax.tool_format is not None and _dialect(syntax).prompt_tail


def _ending_markers(syntax: Syntax) -> tuple[str, ...]:
    """What may end the thoughts the prompt opened before their closing
    marker: a call section (Dialect.calls_end_thoughts) where the request
    offered tools, and the answer's own wrapper (Cohere2's <|START_TEXT|>)
    whether or not it did, as upstream's."""
    if syntax.tool_format is None:
        return ()
    dialect = _dialect(syntax)
    if syntax.calls:
        return dialect.calls_end_thoughts
    wrap = dialect.content_wrap
    return (wrap[0],) if wrap is not None and wrap[0] in dialect.calls_end_thoughts else ()


def _calls_start(text: str, start: int, end: int, markers, syntax: Syntax, partial: bool) -> int:
    """Where a call section ends the thoughts before their closing marker
    (-1: none does): it must hold a call to an offered tool, or, partial,
    may still become one."""
    stop = end if end >= 0 else len(text)
    for i in sorted(i for m in markers if 0 <= (i := text.find(m, start, stop + len(m)))):
        if i >= stop:
            break
        wrap = _dialect(syntax).content_wrap
        if wrap is not None and text.startswith(wrap[0], i):
            return i  # the answer's own wrapper starts (Cohere2's <|START_TEXT|>)
        _, calls = _split_tools(text[i:], syntax, partial)
        if calls:
            return i
        if partial and not _split_tools(text[i:], syntax, True)[0].strip():
            return i  # the section is still undecided
    return -1


# -- streaming ----------------------------------------------------------------------------

_ID_CHARS = string.digits + string.ascii_uppercase + string.ascii_lowercase


def tool_call_id() -> str:
    """upstream's shape: 32 random alphanumerics."""
    return "".join(secrets.choice(_ID_CHARS) for _ in range(32))


@attrs.frozen
class Diff:
    """One change between two parses: a text delta, or a tool call's
    header (id and name, first time only) and/or arguments delta."""

    reasoning_content: str = ""
    content: str = ""
    tool_index: int | None = None
    tool_id: str = ""
    tool_name: str = ""
    tool_arguments: str = ""


def _extension(old: str, new: str) -> str:
    return new[len(old):] if new.startswith(old) else ""


def subtract(full: ChatMsg, base: ChatMsg) -> ChatMsg:
    """What `full` adds to `base` (a continuation's prefill).  A call the
    prefill opened but did not close is the output's: it is reported whole
    (a prefill that starts a call is how a client forces one)."""
    done = len(base.tool_calls)
    if done and not base.tool_calls[-1].complete:
        done -= 1
    return ChatMsg(content=_extension(base.content, full.content),
                   reasoning_content=_extension(base.reasoning_content, full.reasoning_content),
                   tool_calls=full.tool_calls[done:])


class ChatStream:
    """Incremental parsing of one generation.

    `prefix` is text the output continues (an assistant prefill); it is
    parsed with the output, and, unless `echo`, what it parses to is left
    out of the message.  Tool-call ids are drawn once per call, on first
    sight, and kept."""

    def __init__(self, syntax: Syntax, prefix: str = "", echo: bool = False) -> None:
        self.syntax = syntax
        self.text = prefix
        self._base = ChatMsg() if echo or not prefix else parse(prefix, syntax, partial=True)
        self._ids: list[str] = []
        self.msg = ChatMsg()  # what has been reported so far

    def _message(self, partial: bool) -> ChatMsg:
        msg = subtract(parse(self.text, self.syntax, partial), self._base)
        while len(self._ids) < len(msg.tool_calls):
            # a call's id is fixed when it is first seen: the dialect's, else drawn
            self._ids.append(msg.tool_calls[len(self._ids)].id or tool_call_id())
        calls = tuple(attrs.evolve(c, id=i) for c, i in zip(msg.tool_calls, self._ids))
        return attrs.evolve(msg, tool_calls=calls)

    def update(self, piece: str, final: bool = False) -> list[Diff]:
        self.text += piece
        new = self._message(partial=not final)
        diffs = compute_diffs(self.msg, new)
        self.msg = new
        return diffs

    def finish(self) -> list[Diff]:
        return self.update("", final=True)


def compute_diffs(old: ChatMsg, new: ChatMsg) -> list[Diff]:
    diffs: list[Diff] = []
    if new.reasoning_content != old.reasoning_content:
        delta = _extension(old.reasoning_content, new.reasoning_content)
        if delta:
            diffs.append(Diff(reasoning_content=delta))
    if new.content != old.content:
        delta = _extension(old.content, new.content)
        if delta:
            diffs.append(Diff(content=delta))
    for k, call in enumerate(new.tool_calls):
        if k < len(old.tool_calls):
            delta = _extension(old.tool_calls[k].arguments, call.arguments)
            if delta:
                diffs.append(Diff(tool_index=k, tool_arguments=delta))
        else:
            diffs.append(Diff(tool_index=k, tool_id=call.id, tool_name=call.name,
                              tool_arguments=call.arguments))
    return diffs

"""Every model family's tool-call and reasoning dialect, in one table.

`detect(template_source)` picks a family's dialect by the markers its
template spells, checked in the order below (upstream's order for the
families it special-cases, then the rest, most specific first): the
first whose rule matches wins; a template that teaches some other call
wrapper gets the generic dialect derived from its own rendering of an
assistant tool call (generic.py), and one that teaches none gets "none".
`parse(dialect, text, ...)` reads one generation into content, reasoning
and calls; chat/parser.py runs the same code for the server's streams.

A dialect module holds its detection rule, its call syntax (the split
from answer text to content and calls, full and partial), where its
thoughts go, and how a required / named call is forced: the text that
opens a call in the family's own syntax and the Lark grammar of the rest.
"""

from __future__ import annotations

from .base import Dialect, Parsed, ToolCall, after_thoughts
from .table import BY_NAME, NONE, TABLE, detect, lookup

OFFERED: tuple = ()  # parse's default: calls are read, no schemas known


def parse(dialect: str | Dialect, text: str, *, partial: bool = False,
          reasoning: bool | str = True,
          thinking_open: bool = False, tools=OFFERED, generation_prompt: str = "",
          enable_thinking: bool = True) -> Parsed:
    """One generation read in `dialect`: `reasoning` places thoughts in
    reasoning_content (upstream's auto / deepseek), `thinking_open` says the
    prompt ended inside a thinking block; `tools` (the request's) types
    tag-written parameters by their schemas, None saying the request offered
    none (then no calls are read, as upstream's); `generation_prompt` (the text
    the template ended the prompt with) gives back its open thinking marker
    where reasoning is not split out, as upstream does; with `enable_thinking`
    off and a prompt that closed an empty thinking block, a block the model
    writes anyway is content."""
    from ..parser import parse as parse_text
    if isinstance(reasoning, str):  # a reasoning_format: only "none" leaves thoughts in place
        reasoning = reasoning != "none"
    syntax = syntax_for(dialect, reasoning_format="auto" if reasoning else "none",
                        thinking_open=thinking_open, tools=tools,
                        generation_prompt=generation_prompt, enable_thinking=enable_thinking,
                        raw_partials=True)
    msg = parse_text(text, syntax, partial)
    return Parsed(msg.content, msg.reasoning_content,
                  tuple(ToolCall(c.name, c.arguments, c.id) for c in msg.tool_calls))


def syntax_for(dialect: str | Dialect, *, reasoning_format: str, thinking_open: bool,
               tools=OFFERED, generation_prompt: str = "", enable_thinking: bool = True,
               think: tuple[str, str] | None = None, raw_partials: bool = False,
               skip: bool = False):
    """The parser's Syntax for one request in `dialect`, as upstream reads it:
    `tools` None says the request offered none (no calls are read, the
    dialect's message shape still is); `generation_prompt` gives the prompt's
    open thinking marker (put back under reasoning "none") and, with thinking
    off, whether the prompt closed an empty block (a block the model writes
    then is content); `think` overrides the dialect's markers (the server's
    settings).  One builder for the server and for parse() above, so the
    conformance corpus holds the server's reading."""
    from ..parser import Syntax
    d = lookup(dialect)
    start, end = think or (d.think if d.think is not None else ("<think>", "</think>"))
    closed = not enable_thinking and not thinking_open and not d.thinks_after_close \
        and _empty_block(generation_prompt, start, end)
    return Syntax(reasoning_format=reasoning_format, thinking_open=thinking_open,
                  think_start=start, think_end=end, tool_format=d,
                  tools=() if tools is OFFERED else tuple(tools or ()),
                  calls=tools is not None, raw_partials=raw_partials,
                  opener=_opener(generation_prompt, start), closed_think=closed, skip=skip)


def _empty_block(generation_prompt: str, start: str, end: str) -> bool:
    """The prompt ends in an empty thinking block (`<think>\n\n</think>`)."""
    tail = generation_prompt.rstrip()
    if not (start and end and tail.endswith(end)):
        return False
    i = tail.rfind(start)
    return i >= 0 and not tail[i + len(start):-len(end)].strip()


def _opener(generation_prompt: str, start: str) -> str:
    i = generation_prompt.rfind(start) if start else -1
    return generation_prompt[i:] if i >= 0 else ""


__all__ = ["BY_NAME", "Dialect", "NONE", "Parsed", "TABLE", "ToolCall", "after_thoughts", "detect",
           "lookup", "parse", "syntax_for"]

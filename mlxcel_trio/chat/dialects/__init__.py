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

from . import deepseek, generic, glm_4_5, gpt_oss, hermes, kimi_k2, llama3, minimax_m2, \
    mistral, others, pythonic, qwen3_coder, seed_oss
from .base import Dialect, Parsed, ToolCall



def _hermes_like(name: str, *markers: str) -> Dialect:
    import attrs
    return attrs.evolve(hermes.DIALECT, name=name,
                        detect=lambda src: any(m in src for m in markers))


TABLE: tuple[Dialect, ...] = (
    # upstream's special-cased families, in its order
    mistral.SMALL,                 # [TOOL_CALLS]NAME[ARGS] (Small 3.2, Magistral, Ministral 3, Devstral)
    gpt_oss.DIALECT,               # <|channel|>
    others.FUNCTIONARY_V3_2,       # >>>all
    kimi_k2.DIALECT,               # <|tool_calls_section_begin|>
    others.COHERE2,                # <|START_TEXT|> + <|START_ACTION|>
    pythonic.LFM2,                 # <|tool_call_start|>[f(...)]
    others.GIGACHAT3,              # <|role_sep|> <|message_sep|>
    minimax_m2.M3,                 # ]<]minimax[>[
    deepseek.DSML,                 # dsml_token
    pythonic.GEMMA4,               # <|tool_call>call:
    pythonic.MINICPM5,             # <function name="..."><param name="...">
    qwen3_coder.DIALECT,           # <tool_call><function=...><parameter=...>
    # the rest
    minimax_m2.DIALECT,            # <minimax:tool_call>
    glm_4_5.DIALECT,               # <tool_call>NAME<arg_key>
    seed_oss.DIALECT,              # <seed:tool_call>
    deepseek.R1,                   # <｜tool▁calls▁begin｜> + ```json
    deepseek.V3_1,                 # <｜tool▁calls▁begin｜>
    others.COMMAND_R7B,            # <|START_ACTION|> + <|START_RESPONSE|>
    others.GRANITE,                # <|tool_call|>
    others.FUNCTIONARY_V3_1,       # <function=NAME> in a Llama 3.1 template
    others.FIREFUNCTION,           # functools[
    others.APERTUS,                # <|tools_prefix|>
    others.NEMOTRON_V2,            # <TOOLCALL>
    others.APRIEL,                 # [BEGIN FINAL RESPONSE]
    mistral.NEMO,                  # [TOOL_CALLS][
    # a SmolLM3 template that renders no tools: upstream reads no calls from
    # it (one that teaches `<tool_call>` goes by Hermes')
    Dialect("smollm3", lambda src: ("SmolLM3" in src or "named SmolLM" in src)
            and hermes.OPEN not in src),
    _hermes_like("xiaomi_mimo", "You are MiMo"),
    hermes.DIALECT,                # <tool_call>{json}</tool_call>
    llama3.DIALECT,                # Llama 3.x JSON / <|python_tag|>
)
NONE = Dialect("none", lambda src: True)
BY_NAME: dict[str, Dialect] = {d.name: d for d in (*TABLE, NONE, generic.PLACEHOLDER)}


OFFERED: tuple = ()  # parse's default: calls are read, no schemas known


def detect(template_source: str) -> Dialect:
    for dialect in TABLE:
        if dialect.detect(template_source):
            # a family member that forces calls its own way
            return mistral.small_variant(deepseek.dsml_variant(dialect, template_source),
                                         template_source)
    derived = generic.derive(template_source)
    return derived if derived is not None else NONE


def lookup(dialect: str | Dialect) -> Dialect:
    return dialect if isinstance(dialect, Dialect) else BY_NAME[dialect]


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
    from ..parser import Syntax, parse as parse_text
    d = lookup(dialect)
    if isinstance(reasoning, str):  # a reasoning_format: only "none" leaves thoughts in place
        reasoning = reasoning != "none"
    start, end = d.think if d.think is not None else ("<think>", "</think>")
    closed = not enable_thinking and not thinking_open and _empty_block(generation_prompt, start, end)
    syntax = Syntax(reasoning_format="auto" if reasoning else "none", thinking_open=thinking_open,
                    think_start=start, think_end=end, tool_format=d,
                    tools=() if tools is OFFERED else tuple(tools or ()),
                    calls=tools is not None, raw_partials=True,
                    opener=_opener(generation_prompt, start), closed_think=closed)
    msg = parse_text(text, syntax, partial)
    return Parsed(msg.content, msg.reasoning_content,
                  tuple(ToolCall(c.name, c.arguments, c.id) for c in msg.tool_calls))


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


__all__ = ["BY_NAME", "Dialect", "NONE", "Parsed", "TABLE", "ToolCall", "detect", "lookup",
           "parse"]

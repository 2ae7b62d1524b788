"""The dialect table: every family's dialect in detection order, by name;
`detect` and `lookup` (chat/parser.py resolves a name through this module,
imported once at its top: the package's parse() imports the parser only
when called)."""

from __future__ import annotations

import attrs

from . import deepseek, generic, glm_4_5, gpt_oss, hermes, kimi_k2, kimi_k3, lfm2, llama3, \
    minimax_m2, minimax_m3, mistral, muse_glimmer, others, pythonic, qwen3_coder, seed_oss
from .base import Dialect, think_of



def _hermes_like(name: str, *markers: str) -> Dialect:
    return attrs.evolve(hermes.DIALECT, name=name,
                        detect=lambda src: any(m in src for m in markers))


TABLE: tuple[Dialect, ...] = (
    # upstream's special-cased families, in its order
    mistral.SMALL,                 # [TOOL_CALLS]NAME[ARGS] (Small 3.2, Magistral, Ministral 3, Devstral)
    gpt_oss.DIALECT,               # <|channel|>
    muse_glimmer.DIALECT,          # <atem:function_calls> + <|eom|>
    others.FUNCTIONARY_V3_2,       # >>>all
    kimi_k2.DIALECT,               # <|tool_calls_section_begin|>
    kimi_k3.DIALECT,               # <|open|>TAG<|sep|> ... <|close|>TAG<|sep|>
    others.COHERE2,                # <|START_TEXT|> + <|START_ACTION|>
    lfm2.DIALECT,                  # <|tool_call_start|>[f(...)]
    others.GIGACHAT3,              # <|role_sep|> <|message_sep|> (3.1: <|function_call|>)
    minimax_m3.DIALECT,            # ]<]minimax[>[
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
            and hermes.OPEN not in src, prompt_tail=True),
    _hermes_like("xiaomi_mimo", "You are MiMo"),
    hermes.DIALECT,                # <tool_call>{json}</tool_call>
    llama3.DIALECT,                # Llama 3.x JSON / <|python_tag|>
)
NONE = Dialect("none", lambda src: True)
# a family member that writes or forces calls its own way: (dialect, source) -> dialect
_VARIANTS = (deepseek.dsml_variant, mistral.small_variant, glm_4_5.variant, others.gigachat_variant)
BY_NAME: dict[str, Dialect] = {d.name: d for d in (*TABLE, NONE, generic.PLACEHOLDER)}


def detect(template_source: str) -> Dialect:
    """The template's dialect, with the thinking markers this template spells."""
    for dialect in TABLE:
        if dialect.detect(template_source):
            found = dialect
            for variant in _VARIANTS:
                found = variant(found, template_source)
            break
    else:
        found = generic.derive(template_source)
        if found is None:
            return NONE
    found = _raw_thoughts(found, template_source)
    think = think_of(found, template_source)
    return found if think == found.think else attrs.evolve(found, think=think)


def _raw_thoughts(dialect: Dialect, source: str) -> Dialect:
    """Hermes' calls under upstream's autoparser: its thinking opener is the
    one the template writes past thoughts with (`<think>\n`, the newline
    included) where it renders them; a template that never renders
    reasoning_content (QwQ) leaves only its prompt's `<think>`, so the
    newline after it is the thoughts', untrimmed, as DeepSeek R1's."""
    if dialect.name in ("hermes", "xiaomi_mimo") and "reasoning_content" not in source:
        return attrs.evolve(dialect, raw_thoughts=True)
    return dialect


def lookup(dialect: str | Dialect) -> Dialect:
    return dialect if isinstance(dialect, Dialect) else BY_NAME[dialect]

"""An OpenAI chat-completions body -> the prompt, and how to read the output.

This is llama-server's `oaicompat_chat_params_parse` in our terms, with its
checks in its order and its wording (the checks shared with the legacy
path, --no-jinja, are chat_checks.py's).  The result is a `ChatPlan`: the
rendered prompt and its tokens, the parser `Syntax` for the output, the
assistant prefill the output continues, and the body the native field
table reads (max_tokens, n, stop, temperature, ...).

Rendering follows transformers' `apply_chat_template` (see chat/template.py);
a trailing assistant message is continued (--prefill-assistant) by
rendering the messages before it with the generation prompt and appending
its text, so the model writes on from where the prefill stops.
"""

from __future__ import annotations

import json
from typing import Any

from ...chat.dialects import after_thoughts, lookup, syntax_for
from ...chat.parser import Syntax
from ...chat.settings import ChatSettings
from ...chat.template import TemplateError
from .chat_checks import (
    ChatPlan,
    bad,
    check_constraints,
    check_messages,
    content_text,
    continuation,
    failed,
    native_body,
    parse_messages,
    parse_tools,
    read_reasoning_format,
    template_kwargs,
)
from .jobs import tokenize_within


# -- the plan -----------------------------------------------------------------------------


def _flatten(msg: dict) -> dict:
    """Text parts -> one string, for a template that reads string content only."""
    if isinstance(msg.get("content"), list):
        return {**msg, "content": content_text(msg["content"])}
    return msg


def _object_arguments(msg: dict) -> dict:
    """A template that reads a call's arguments as a mapping (Qwen3-Coder's
    `arguments|items`) is given them parsed, as upstream's workaround does
    for templates whose caps show object arguments."""
    calls = msg.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        return msg
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            try:
                args = json.loads(fn["arguments"])
            except ValueError:
                args = None
            if isinstance(args, dict):
                call = {**call, "function": {**fn, "arguments": args}}
        out.append(call)
    return {**msg, "tool_calls": out}


def _tool_choice(body: dict) -> tuple[str, str | None]:
    """(choice, the function a named choice forces).  A string is upstream's
    (auto, none, required); an object naming a function, in the chat
    ({"type": "function", "function": {"name": ...}}) or the Responses
    ({"type": "function", "name": ...}) shape, forces that function (upstream
    reads any object as "auto")."""
    value = body.get("tool_choice")
    if isinstance(value, dict):
        fn = value.get("function") if isinstance(value.get("function"), dict) else value
        if value.get("type") == "function" and isinstance(fn.get("name"), str):
            return "named", fn["name"]
        return "auto", None
    choice = value if isinstance(value, str) else "auto"
    if choice not in ("auto", "none", "required"):
        raise bad(f"Invalid tool_choice: {choice}")
    return choice, None


def _forced_call(choice: str, name: str | None, tools, settings: ChatSettings,
                 primed: bool, generating: bool) -> str:
    """The text a required or named tool_choice starts the answer with: the
    opening of a call in the template's own dialect (the parser then reports
    the call whole), after the thinking block the prompt left open, closed.
    The grammar (tool_call_grammar) constrains the rest."""
    if choice not in ("required", "named") or not tools:
        return ""
    if name is not None and name not in {t["function"]["name"] for t in tools}:
        raise bad(f"tool_choice names {name!r}, which is not one of the request's tools")
    fmt = settings.tool_format
    dialect = lookup(fmt) if fmt is not None else None
    if dialect is None or dialect.opener is None or settings.skip_parsing:
        if not generating:
            return ""
        raise bad("tool_choice 'required' or a named function needs a known tool-call format "
                  "to force a call, and this chat template's is not one mlxcel-trio parses; "
                  "use 'auto'")
    close = settings.think_end + "\n\n" if primed else ""
    return close + dialect.opener(name)


def tool_call_grammar(choice: str, name: str | None, tools, fmt,
                      parallel: bool = False) -> str | None:
    """What may follow a forced call's opening, in the dialect's own syntax:
    the arguments as the tool's JSON schema (or, where the family writes
    parameters as tags, each parameter's), then the call's close, as
    upstream constrains a required / named call with a grammar.  `parallel`
    (required, where the dialect can write another call): more calls may
    follow; otherwise the answer ends after the one call.  None: the
    dialect has no grammar (the opening alone forces the call)."""
    if choice not in ("required", "named") or not tools or fmt is None:
        return None
    dialect = lookup(fmt)
    if dialect.grammar is None:
        return None
    return dialect.grammar(tools, name, parallel)


def _thoughts_first(settings: ChatSettings, primed: bool, gen: str,
                    budget: int) -> tuple[str | None, str, bool] | None:
    """The reasoning block a required / named call comes after, as vLLM
    forces a call once the reasoning ends (upstream's grammar lets free text
    come first instead): (its opening, None where the prompt opened it; its
    close; whether blank lines follow the close), or None where the call
    comes at once: the template does not think, its prompt closed the block
    (thinking turned off), or the reasoning budget asked for is 0 (which
    also keeps GPT-OSS from its analysis channel)."""
    dialect = lookup(settings.tool_format)
    if budget == 0:
        return None
    if dialect.thought is not None:  # a channel of its own (GPT-OSS analysis)
        return dialect.thought[0], dialect.thought[1], False
    start, end = settings.think_start, settings.think_end
    if not (settings.thinks and start and end):
        return None
    if primed:
        return None, end, True
    return None if end in gen else (start, end, True)


def _forced_plan(body: dict, settings: ChatSettings, vocab, choice: str, name: str | None,
                 tools, primed: bool, gen: str, prefill: str) -> tuple[str, str | None]:
    """A required / named call's (prefill, grammar): the opening prefilled
    and the grammar of the rest, or, where the request lets the model reason
    first, nothing prefilled and a grammar that takes the thoughts, their
    close, then the opening (the same for /apply-template, which shows the
    prompt generation continues)."""
    parallel = body.get("parallel_tool_calls")
    if not isinstance(parallel, bool):  # upstream: the template's capability
        parallel = settings.caps.get("supports_parallel_tool_calls", False)
    grammar = tool_call_grammar(choice, name, tools, settings.tool_format, parallel)
    first = _thoughts_first(settings, primed, gen, _asked_budget(body, settings))
    if first is None or grammar is None:
        return prefill, grammar
    open_, close, gap = first
    return "", after_thoughts(grammar, lookup(settings.tool_format).opener(name), close,
                              open_, vocab.single_id, gap)


def _thinking_open(prompt_tail: str, settings: ChatSettings) -> bool:
    start, end = settings.think_start, settings.think_end
    if not start:
        return False
    return prompt_tail.rfind(start) > prompt_tail.rfind(end) if start in prompt_tail else False


def _generation_prompt(settings: ChatSettings, messages, tools, kwargs, rendered: str) -> str:
    """The text the template adds for the assistant turn (what the output
    continues), found by rendering once more without it."""
    bare = settings.template.render(messages, tools=tools, add_generation_prompt=False,
                                    kwargs=kwargs)
    return rendered[len(bare):] if rendered.startswith(bare) else rendered[-256:]


def plan(body: Any, settings: ChatSettings, vocab, generating: bool = True,
         limit: int | None = None) -> ChatPlan:
    """`generating` False: the prompt only (/apply-template, input-token
    counts), so fields that only shape decoding are not refused.  `limit`:
    the slot's context, past which the prompt is refused on its token count
    (request/jobs.py tokenize_within)."""
    if not isinstance(body, dict):
        raise bad("'messages' is required")
    if not settings.jinja:  # --no-jinja, or a built-in format named
        from .chat_legacy import legacy_plan
        return legacy_plan(body, settings, vocab, limit)
    tools_value = body.get("tools")
    has_tools = isinstance(tools_value, list) and bool(tools_value)
    stream = body.get("stream") if isinstance(body.get("stream"), bool) else False
    tool_choice, forced_name = _tool_choice(body)
    schema = check_constraints(body, has_tools, stream)
    messages = check_messages(body)
    parse_messages(messages)
    tools = parse_tools(tools_value)
    mode, add_gen = continuation(body, settings, messages)
    fmt = read_reasoning_format(body, settings)
    kwargs = template_kwargs(body, settings)
    echo = body.get("echo") is True

    rendered_tools = tools if tool_choice != "none" else ()
    if not settings.typed_content:
        messages = [_flatten(m) for m in messages]
    if settings.caps.get("supports_object_arguments"):
        messages = [_object_arguments(m) for m in messages]
    history, prefill, tool_grammar = messages, "", None
    if mode is not None:
        history, last = messages[:-1], messages[-1]
        add_gen = True
    try:
        prompt = settings.template.render(history, tools=rendered_tools,
                                          add_generation_prompt=add_gen, kwargs=kwargs)
        gen = _generation_prompt(settings, history, rendered_tools, kwargs, prompt) \
            if add_gen else ""
    except TemplateError as exc:
        raise failed(str(exc)) from None
    primed = _thinking_open(gen, settings)
    if mode is not None:
        prefill = _prefill_text(last, mode, primed, settings)
    else:
        prefill = _forced_call(tool_choice, forced_name, rendered_tools, settings, primed,
                               generating)
        if tool_choice in ("required", "named") and rendered_tools \
                and settings.tool_format is not None and not settings.skip_parsing:
            prefill, grammar = _forced_plan(body, settings, vocab, tool_choice, forced_name,
                                            rendered_tools, primed, gen, prefill)
            tool_grammar = grammar if generating else None
        echo = echo and not prefill
    prompt += prefill
    syntax = _syntax(body, settings, fmt, primed, rendered_tools, gen, kwargs)
    # a thinking template's markers decide the budget (upstream overwrites the
    # native reasoning_budget_* fields); otherwise the body's own pass through
    native = native_body(body, schema, _CHAT_BUDGET_FIELDS if settings.thinks else ())
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    budget, message = _budget(body, settings)
    return ChatPlan(prompt=prompt, tokens=tokenize_within(vocab, prompt, False, limit),
                    syntax=syntax,
                    prefill=prefill, echo=echo, tools=rendered_tools, native=native,
                    stream=stream, include_usage=include_usage, budget=budget,
                    budget_message=message,
                    control=settings.thinks and body.get("reasoning_control") is True,
                    tool_grammar=tool_grammar,
                    thinking_open=_thinking_open(gen + prefill, settings) or (
                        primed and settings.think_end not in prefill))


def _syntax(body: dict, settings: ChatSettings, fmt: str, primed: bool, tools, gen: str,
            kwargs: dict) -> Syntax:
    """How the output is read: in the template's dialect, as the conformance
    corpus reads it (its message shape and thinking placement with or without
    tools; the prompt's open or closed thinking block); with
    `parse_tool_calls: false` and tools, the calls stay text."""
    if settings.tool_format is None or tools and body.get("parse_tool_calls", True) is False:
        return Syntax(reasoning_format=fmt, thinking_open=primed, think_start=settings.think_start,
                      think_end=settings.think_end, skip=settings.skip_parsing)
    return syntax_for(settings.tool_format, reasoning_format=fmt, thinking_open=primed,
                      tools=tuple(tools) if tools else None, generation_prompt=gen,
                      enable_thinking=kwargs.get("enable_thinking") is not False,
                      think=(settings.think_start, settings.think_end), skip=settings.skip_parsing)


_CHAT_BUDGET_FIELDS = ("reasoning_budget_tokens", "reasoning_budget_start_tag",
                       "reasoning_budget_end_tags", "reasoning_budget_end_tag",
                       "reasoning_budget_message", "reasoning_control")


def _int_or(body: dict, key: str, default: int) -> int:
    value = body.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _budget(body: dict, settings: ChatSettings) -> tuple[int, str]:
    """upstream's reading: reasoning_budget_tokens, else thinking_budget_tokens,
    -1 falling back to --reasoning-budget; only for a template that thinks."""
    if not settings.thinks:
        return -1, ""
    budget = _asked_budget(body, settings)
    message = body.get("reasoning_budget_message")
    return budget, message if isinstance(message, str) else settings.budget_message


def _asked_budget(body: dict, settings: ChatSettings) -> int:
    budget = _int_or(body, "reasoning_budget_tokens", _int_or(body, "thinking_budget_tokens", -1))
    return settings.reasoning_budget if budget == -1 else budget


def _prefill_text(last: dict, mode: str, primed: bool, settings: ChatSettings) -> str:
    content = content_text(last.get("content"), "\n\n")
    reasoning = last.get("reasoning_content") or ""
    if not reasoning:
        return content
    if not primed:
        raise bad("Cannot continue an assistant message that carries reasoning_content: the "
                  "chat template does not open a thinking block for the continuation; send "
                  "the thoughts inside content instead")
    if mode == "reasoning_content":
        return reasoning
    return reasoning + settings.think_end + content

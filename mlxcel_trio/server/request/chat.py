"""An OpenAI chat-completions body -> the prompt, and how to read the output.

This is llama-server's `oaicompat_chat_params_parse` in our terms, with its
checks in its order and its wording.  Upstream answers a
`std::invalid_argument` 400 and anything else it throws (a message that
fails to parse, a template that raises) 500; every one of those is the
client's request, so all answer 400 here, with upstream's message (the
server's policy for malformed bodies, recorded on the routes).  The result is a `ChatPlan`: the rendered
prompt and its tokens, the parser `Syntax` for the output, the assistant
prefill the output continues, and the body the native field table reads
(max_tokens, n, stop, temperature, ...).

Rendering follows transformers' `apply_chat_template` (see chat/template.py);
a trailing assistant message is continued (--prefill-assistant) by
rendering the messages before it with the generation prompt and appending
its text, so the model writes on from where the prefill stops.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import attrs

from ...chat.dialects import lookup
from ...chat.parser import REASONING_FORMATS, Syntax
from ...chat.settings import ChatSettings
from ...chat.template import TemplateError
from ..http.errors import ApiError, dumps, json_type_name
from .jobs import tokenize_within



def bad(message: str) -> ApiError:
    """upstream's std::invalid_argument: a 400."""
    return ApiError(message)


def failed(message: str) -> ApiError:
    """what upstream throws as a non-invalid_argument (its 500s): the
    request's fault all the same, so a 400."""
    return ApiError(message)


def _dump(value: Any, indent: int | None = None) -> str:
    if indent is None:
        return dumps(value)
    return json.dumps(value, ensure_ascii=False, indent=indent)


@attrs.frozen
class ChatPlan:
    prompt: str
    tokens: list[int]
    syntax: Syntax
    prefill: str                  # text the output continues ("" if none)
    echo: bool                    # the prefill leads the response
    tools: tuple[dict, ...]       # the tools the template saw
    native: dict                  # the body the native field table reads
    stream: bool
    include_usage: bool
    budget: int = -1              # thinking tokens before a forced close (-1: none)
    budget_message: str = ""
    thinking_open: bool = False   # the prompt ends inside a thinking block
    control: bool = False         # reasoning_control: the close can be forced at runtime
    tool_grammar: str | None = None  # lark for a forced call's rest (tool_choice required/named)


# -- messages ---------------------------------------------------------------------------

_MEDIA = {
    "image_url": "image input is not supported - hint: if this is unexpected, you may need "
                 "to provide the mmproj",
    "input_audio": "audio input is not supported - hint: if this is unexpected, you may need "
                   "to provide the mmproj",
    "input_video": "video input is not supported - hint: if this is unexpected, you may need "
                   "to provide the mmproj",
}


def _str_or_default(obj: Any, key: str, default: str = "") -> str:
    """upstream's json_value<std::string>: the value if it is a string."""
    if isinstance(obj, dict) and isinstance(obj.get(key), str):
        return obj[key]
    return default


def _check_messages(body: dict) -> list:
    if "messages" not in body:
        raise bad("'messages' is required")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise bad("Expected 'messages' to be an array")
    for msg in messages:
        role = _str_or_default(msg, "role")
        has = isinstance(msg, dict)
        if role != "assistant" and not (has and "content" in msg):
            raise bad("All non-assistant messages must contain 'content'")
        if role == "assistant":
            if "content" not in msg and "tool_calls" not in msg:
                raise bad("Assistant message must contain either 'content' or 'tool_calls'!")
            if "content" not in msg:
                continue
        content = msg["content"]
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise bad("Expected 'content' to be a string or an array")
        for part in content:
            kind = _str_or_default(part, "type")
            if kind in _MEDIA:
                raise failed(_MEDIA[kind])
            if kind != "text":
                raise bad("unsupported content[].type")
    return messages


def _type_error(expected: str, value: Any) -> str:
    return f"[json.exception.type_error.302] type must be {expected}, but is {json_type_name(value)}"


def _parse_messages(messages: list) -> None:
    """common_chat_msgs_parse_oaicompat's checks (its errors are 500s)."""
    def fail(why: str):
        return failed(f"Failed to parse messages: {why}")

    for msg in messages:
        if "role" not in msg:
            raise fail(f"Missing 'role' in message: {_dump(msg)}")
        if not isinstance(msg["role"], str):
            raise fail(_type_error("string", msg["role"]))
        content = msg.get("content")
        if isinstance(content, list):
            for part in content:
                if "type" not in part:
                    raise fail(f"Missing content part type: {_dump(part)}")
                if "text" not in part:
                    raise fail("[json.exception.out_of_range.403] key 'text' not found")
                if not isinstance(part["text"], str):
                    raise fail(_type_error("string", part["text"]))
        if "tool_calls" in msg:
            calls = msg["tool_calls"]
            for call in (calls.values() if isinstance(calls, dict)
                         else calls if isinstance(calls, list) else [calls]):
                if not isinstance(call, dict) or "type" not in call:
                    raise fail(f"Missing tool call type: {_dump(call)}")
                if call["type"] != "function":
                    raise fail(f"Unsupported tool call type: {_dump(call)}")
                if "function" not in call:
                    raise fail(f"Missing tool call function: {_dump(call)}")
                fn = call["function"]
                if not isinstance(fn, dict) or "name" not in fn:
                    raise fail(f"Missing tool call name: {_dump(call)}")
                if not isinstance(fn["name"], str):
                    raise fail(_type_error("string", fn["name"]))
                if "arguments" not in fn:
                    raise fail("[json.exception.out_of_range.403] key 'arguments' not found")
                if "id" in call and not isinstance(call["id"], str):
                    raise fail(_type_error("string", call["id"]))
        for key in ("reasoning_content", "name", "tool_call_id"):
            if key in msg and not isinstance(msg[key], str):
                raise fail(_type_error("string", msg[key]))


def _parse_tools(tools: Any) -> tuple[dict, ...]:
    """common_chat_tools_parse_oaicompat's checks (500s, the tools echoed)."""
    if tools is None:
        return ()

    def fail(why: str):
        return failed(f"Failed to parse tools: {why}; tools = {_dump(tools, 2)}")

    if not isinstance(tools, list):
        raise fail(f"Expected 'tools' to be an array, got {_dump(tools)}")
    for tool in tools:
        if not isinstance(tool, dict) or "type" not in tool:
            raise fail(f"Missing tool type: {_dump(tool)}")
        if tool["type"] != "function":
            raise fail(f"Unsupported tool type: {_dump(tool)}")
        if "function" not in tool:
            raise fail(f"Missing tool function: {_dump(tool)}")
        fn = tool["function"]
        if not isinstance(fn, dict) or "name" not in fn:
            raise fail("[json.exception.out_of_range.403] key 'name' not found")
        if not isinstance(fn["name"], str):
            raise fail(_type_error("string", fn["name"]))
    return tuple(tools)


# -- the plan -----------------------------------------------------------------------------

def _content_text(content: Any, delimiter: str = "\n") -> str:
    """Text parts joined: by a newline where a template is given one string
    (upstream's concat_content_parts), by a blank line where the text is a
    continued assistant message (upstream's render_content)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return delimiter.join(p["text"] for p in content if isinstance(p, dict) and "text" in p)
    return ""


def _flatten(msg: dict) -> dict:
    """Text parts -> one string, for a template that reads string content only."""
    if isinstance(msg.get("content"), list):
        return {**msg, "content": _content_text(msg["content"])}
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


def _continuation(body: dict, settings: ChatSettings, messages: list) -> tuple[str | None, bool]:
    """(what is continued: None, "content" or "reasoning_content";
    add_generation_prompt), with upstream's refusals."""
    add_gen = body.get("add_generation_prompt", True)
    add_gen = add_gen if isinstance(add_gen, bool) else True
    mode = None
    if "continue_final_message" in body:
        value = body["continue_final_message"]
        if value is True:
            mode = "auto"
        elif value in ("content", "reasoning_content"):
            mode = value
    if mode is None and settings.prefill_assistant and messages \
            and isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant":
        if len(messages) >= 2 and isinstance(messages[-2], dict) \
                and messages[-2].get("role") == "assistant":
            raise bad("Cannot have 2 or more assistant messages at the end of the list.")
        mode, add_gen = "auto", False
    if mode is not None and add_gen:
        raise bad("Cannot set both add_generation_prompt and continue_final_message to true.")
    if mode == "auto" and messages:
        last = messages[-1]
        mode = "content"
        if last.get("reasoning_content") and not _content_text(last.get("content")):
            mode = "reasoning_content"
    return mode, add_gen


def _kwargs(body: dict, settings: ChatSettings) -> dict[str, Any]:
    # upstream's extra context: today's date (local time) in the two spellings
    # Llama 3.x templates print; the server's and the request's kwargs may
    # replace them
    now = datetime.now()
    kwargs = {"datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y"),
              **settings.kwargs}
    request = body.get("chat_template_kwargs")
    if isinstance(request, dict):
        kwargs.update(request)
    if isinstance(kwargs.get("enable_thinking"), str):
        raise bad('invalid type for "enable_thinking" (expected boolean, got string)')
    if "reasoning_effort" in body:
        effort = body["reasoning_effort"]
        if effort == "none":
            kwargs["enable_thinking"] = False
            kwargs.pop("reasoning_effort", None)
        elif isinstance(effort, str) and effort:
            kwargs["reasoning_effort"] = effort
    # upstream hands templates these synonyms too (its jinja caps helpers)
    if isinstance(kwargs.get("preserve_reasoning"), bool):
        keep = kwargs["preserve_reasoning"]
        kwargs.update(preserve_thinking=keep, clear_thinking=not keep,
                      truncate_history_thinking=not keep, drop_thinking=not keep)
    if isinstance(kwargs.get("reasoning_effort"), str) and kwargs["reasoning_effort"]:
        kwargs["reasoning_strength"] = kwargs["reasoning_effort"]
    return kwargs


def _check_constraints(body: dict, has_tools: bool, stream: bool) -> Any:
    """upstream's checks on grammar-shaped fields and logprobs; returns the
    JSON schema response_format asks for (None: none)."""
    if body.get("json_schema") is not None and isinstance(body.get("grammar"), str) \
            and body["grammar"]:
        raise failed("Cannot use both json_schema and grammar")
    schema = None
    fmt = body.get("response_format")
    if "response_format" in body:
        kind = _str_or_default(fmt, "type")
        # the schema as sent, whatever its type (a number is refused when it
        # is converted, as upstream's); absent or null: any JSON value
        if kind == "json_object":
            if "schema" in fmt or body.get("json_schema") in (None, {}, []):
                schema = fmt["schema"] if fmt.get("schema") is not None else {}
        elif kind == "json_schema":
            wrapper = fmt.get("json_schema") if isinstance(fmt.get("json_schema"), dict) else {}
            schema = wrapper["schema"] if wrapper.get("schema") is not None else {}
        elif kind not in ("", "text"):
            raise bad('response_format type must be one of "text" or "json_object", but got: '
                      + kind)
    if has_tools and "grammar" in body:
        raise bad("Cannot use custom grammar constraints with tools.")
    if body.get("logprobs") is True:
        if has_tools and stream:
            raise bad("logprobs is not supported with tools + stream")
    elif body.get("top_logprobs") is not None:
        raise bad("top_logprobs requires logprobs to be set to true")
    return schema


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


def native_body(body: dict, schema: Any, dropped: tuple[str, ...] = ()) -> dict:
    """The body the native field table reads: OpenAI's logprobs / top_logprobs
    become n_probs (20 when top_logprobs is absent), a response_format's
    schema becomes json_schema, and `dropped` fields are left out."""
    native = {k: v for k, v in body.items()
              if k not in ("logprobs", "top_logprobs") and k not in dropped}
    if body.get("logprobs") is True:
        top = body.get("top_logprobs")
        native["n_probs"] = top if isinstance(top, int) and not isinstance(top, bool) else 20
    if schema is not None:
        native["json_schema"] = schema
    return native


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
    schema = _check_constraints(body, has_tools, stream)
    messages = _check_messages(body)
    _parse_messages(messages)
    tools = _parse_tools(tools_value)
    mode, add_gen = _continuation(body, settings, messages)
    fmt = _reasoning_format(body, settings)
    kwargs = _kwargs(body, settings)
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
        echo = echo and not prefill
        if generating and tool_choice in ("required", "named") and rendered_tools \
                and settings.tool_format is not None and not settings.skip_parsing:
            parallel = body.get("parallel_tool_calls")
            if not isinstance(parallel, bool):  # upstream: the template's capability
                parallel = settings.caps.get("supports_parallel_tool_calls", False)
            tool_grammar = tool_call_grammar(tool_choice, forced_name, rendered_tools,
                                             settings.tool_format, parallel)
    prompt += prefill
    syntax = Syntax(
        reasoning_format=fmt,
        thinking_open=primed,
        think_start=settings.think_start,
        think_end=settings.think_end,
        tool_format=settings.tool_format if rendered_tools and body.get(
            "parse_tool_calls", True) is not False else None,
        tools=tuple(rendered_tools),
        skip=settings.skip_parsing,
    )
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


def _reasoning_format(body: dict, settings: ChatSettings) -> str:
    if "reasoning_format" not in body:
        return settings.reasoning_format
    fmt = body["reasoning_format"]
    if not isinstance(fmt, str):
        raise failed(_type_error("string", fmt))
    if fmt not in REASONING_FORMATS:
        raise failed(f"Unknown reasoning format: {fmt}")
    return fmt


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
    budget = _int_or(body, "reasoning_budget_tokens", _int_or(body, "thinking_budget_tokens", -1))
    if budget == -1:
        budget = settings.reasoning_budget
    message = body.get("reasoning_budget_message")
    return budget, message if isinstance(message, str) else settings.budget_message


def _prefill_text(last: dict, mode: str, primed: bool, settings: ChatSettings) -> str:
    content = _content_text(last.get("content"), "\n\n")
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

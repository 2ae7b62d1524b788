"""The checks both chat plans make, in upstream's order and wording.

llama-server's `oaicompat_chat_params_parse` takes the same steps with or
without Jinja (chat.py's plan and chat_legacy.py's): the body's messages,
tools, grammar-shaped fields, continuation, template kwargs and reasoning
format are checked here, and `ChatPlan` is what either plan returns.
Upstream answers a `std::invalid_argument` 400 and anything else it throws
500; every one of those is the client's request, so all answer 400 here.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import attrs

from ...chat.parser import REASONING_FORMATS, Syntax
from ...chat.settings import ChatSettings
from ..http.errors import ApiError, dumps, type_mismatch


def bad(message: str) -> ApiError:
    """upstream's std::invalid_argument: a 400."""
    return ApiError(message)


def failed(message: str) -> ApiError:
    """what upstream throws as a non-invalid_argument (its 500s): the
    request's fault all the same, so a 400."""
    return ApiError(message)


def dump(value: Any, indent: int | None = None) -> str:
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


_MEDIA = {
    "image_url": "image input is not supported - hint: if this is unexpected, you may need "
                 "to provide the mmproj",
    "input_audio": "audio input is not supported - hint: if this is unexpected, you may need "
                   "to provide the mmproj",
    "input_video": "video input is not supported - hint: if this is unexpected, you may need "
                   "to provide the mmproj",
}


def str_or_default(obj: Any, key: str, default: str = "") -> str:
    """upstream's json_value<std::string>: the value if it is a string."""
    if isinstance(obj, dict) and isinstance(obj.get(key), str):
        return obj[key]
    return default


def check_messages(body: dict) -> list:
    if "messages" not in body:
        raise bad("'messages' is required")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise bad("Expected 'messages' to be an array")
    for msg in messages:
        role = str_or_default(msg, "role")
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
            kind = str_or_default(part, "type")
            if kind in _MEDIA:
                raise failed(_MEDIA[kind])
            if kind != "text":
                raise bad("unsupported content[].type")
    return messages


def parse_messages(messages: list) -> None:
    """common_chat_msgs_parse_oaicompat's checks (its errors are 500s)."""
    def fail(why: str):
        return failed(f"Failed to parse messages: {why}")

    for msg in messages:
        if "role" not in msg:
            raise fail(f"Missing 'role' in message: {dump(msg)}")
        if not isinstance(msg["role"], str):
            raise fail(type_mismatch("string", msg["role"]))
        content = msg.get("content")
        if isinstance(content, list):
            for part in content:
                if "type" not in part:
                    raise fail(f"Missing content part type: {dump(part)}")
                if "text" not in part:
                    raise fail("[json.exception.out_of_range.403] key 'text' not found")
                if not isinstance(part["text"], str):
                    raise fail(type_mismatch("string", part["text"]))
        if "tool_calls" in msg:
            calls = msg["tool_calls"]
            for call in (calls.values() if isinstance(calls, dict)
                         else calls if isinstance(calls, list) else [calls]):
                if not isinstance(call, dict) or "type" not in call:
                    raise fail(f"Missing tool call type: {dump(call)}")
                if call["type"] != "function":
                    raise fail(f"Unsupported tool call type: {dump(call)}")
                if "function" not in call:
                    raise fail(f"Missing tool call function: {dump(call)}")
                fn = call["function"]
                if not isinstance(fn, dict) or "name" not in fn:
                    raise fail(f"Missing tool call name: {dump(call)}")
                if not isinstance(fn["name"], str):
                    raise fail(type_mismatch("string", fn["name"]))
                if "arguments" not in fn:
                    raise fail("[json.exception.out_of_range.403] key 'arguments' not found")
                if "id" in call and not isinstance(call["id"], str):
                    raise fail(type_mismatch("string", call["id"]))
        for key in ("reasoning_content", "name", "tool_call_id"):
            if key in msg and not isinstance(msg[key], str):
                raise fail(type_mismatch("string", msg[key]))


def parse_tools(tools: Any) -> tuple[dict, ...]:
    """common_chat_tools_parse_oaicompat's checks (500s, the tools echoed)."""
    if tools is None:
        return ()

    def fail(why: str):
        return failed(f"Failed to parse tools: {why}; tools = {dump(tools, 2)}")

    if not isinstance(tools, list):
        raise fail(f"Expected 'tools' to be an array, got {dump(tools)}")
    for tool in tools:
        if not isinstance(tool, dict) or "type" not in tool:
            raise fail(f"Missing tool type: {dump(tool)}")
        if tool["type"] != "function":
            raise fail(f"Unsupported tool type: {dump(tool)}")
        if "function" not in tool:
            raise fail(f"Missing tool function: {dump(tool)}")
        fn = tool["function"]
        if not isinstance(fn, dict) or "name" not in fn:
            raise fail("[json.exception.out_of_range.403] key 'name' not found")
        if not isinstance(fn["name"], str):
            raise fail(type_mismatch("string", fn["name"]))
    return tuple(tools)


def content_text(content: Any, delimiter: str = "\n") -> str:
    """Text parts joined: by a newline where a template is given one string
    (upstream's concat_content_parts), by a blank line where the text is a
    continued assistant message (upstream's render_content)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return delimiter.join(p["text"] for p in content if isinstance(p, dict) and "text" in p)
    return ""


def continuation(body: dict, settings: ChatSettings, messages: list) -> tuple[str | None, bool]:
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
        if last.get("reasoning_content") and not content_text(last.get("content")):
            mode = "reasoning_content"
    return mode, add_gen


def template_kwargs(body: dict, settings: ChatSettings) -> dict[str, Any]:
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


def check_constraints(body: dict, has_tools: bool, stream: bool) -> Any:
    """upstream's checks on grammar-shaped fields and logprobs; returns the
    JSON schema response_format asks for (None: none)."""
    if body.get("json_schema") is not None and isinstance(body.get("grammar"), str) \
            and body["grammar"]:
        raise failed("Cannot use both json_schema and grammar")
    schema = None
    fmt = body.get("response_format")
    if "response_format" in body:
        kind = str_or_default(fmt, "type")
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


def read_reasoning_format(body: dict, settings: ChatSettings) -> str:
    if "reasoning_format" not in body:
        return settings.reasoning_format
    fmt = body["reasoning_format"]
    if not isinstance(fmt, str):
        raise failed(type_mismatch("string", fmt))
    if fmt not in REASONING_FORMATS:
        raise failed(f"Unknown reasoning format: {fmt}")
    return fmt


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

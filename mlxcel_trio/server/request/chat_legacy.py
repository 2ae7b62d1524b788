"""The legacy chat path (llama-server's --no-jinja) for a chat body.

upstream's `oaicompat_chat_params_parse` takes the same steps with or
without Jinja, except that without it a request with tools (or a
tool_choice other than "auto") is refused first, and the prompt comes from
the built-in format (chat/legacy.py) fed each message's role and text:
no tools, no reasoning, and no continuation (a trailing assistant message
is written whole, add_generation_prompt off).  The output is read as
content only.  The checks shared with the Jinja path are chat_checks.py's.
"""

from __future__ import annotations

from ...chat import legacy
from ...chat.parser import Syntax
from ...chat.settings import ChatSettings
from ..http.errors import ApiError
from .chat_checks import (
    ChatPlan,
    check_constraints,
    check_messages,
    continuation,
    native_body,
    parse_messages,
    parse_tools,
    read_reasoning_format,
    template_kwargs,
)
from .jobs import tokenize_within


def _needs_jinja(param: str, settings: ChatSettings) -> ApiError:
    """upstream's refusal on its legacy path, with its wording, as a 400
    (upstream: 500 server_error; a 5xx makes the OpenAI SDK retry a request
    that can never succeed on this server)."""
    if settings.named:  # --jinja is on; the built-in name is what has no tools
        return ApiError(f"{param} param requires a Jinja chat template: --chat-template "
                        f"{settings.legacy} selects llama-server's built-in format, which "
                        f"renders no tools; pass the template's Jinja text with "
                        f"--chat-template-file to use {param}")
    return ApiError(f"{param} param requires --jinja flag")


def legacy_plan(body: dict, settings: ChatSettings, vocab, limit: int | None = None) -> ChatPlan:
    """upstream's legacy path: the same checks in the same order, then the
    prompt in the built-in format from each message's role and text.  No
    tools, and nothing is continued: a trailing assistant message is
    written whole, with add_generation_prompt off; the output is content."""
    tools_value = body.get("tools")
    if isinstance(tools_value, list) and tools_value:
        raise _needs_jinja("tools", settings)
    choice = body.get("tool_choice")
    if isinstance(choice, str) and choice != "auto":
        raise _needs_jinja("tool_choice", settings)
    stream = body.get("stream") if isinstance(body.get("stream"), bool) else False
    schema = check_constraints(body, False, stream)
    messages = check_messages(body)
    parse_messages(messages)
    parse_tools(tools_value)
    _, add_gen = continuation(body, settings, messages)
    fmt = read_reasoning_format(body, settings)
    template_kwargs(body, settings)  # its refusals hold on this path too
    if settings.legacy is None:
        raise ApiError("this custom template is not supported, try using --jinja",
                       type="server_error")
    prompt = legacy.render(settings.legacy, legacy.turns(messages), add_gen)
    native = native_body(body, schema)
    options = body.get("stream_options")
    return ChatPlan(prompt=prompt, tokens=tokenize_within(vocab, prompt, False, limit),
                    syntax=Syntax(reasoning_format=fmt, think_start="", think_end="",
                                  skip=True),
                    prefill="", echo=False, tools=(), native=native, stream=stream,
                    include_usage=isinstance(options, dict)
                    and options.get("include_usage") is True)

"""The chat surfaces' handler entries, merged into server/app.py's table.

Each entry takes the request body (or nothing) as app.py's mount expects;
`ctx` gives the running server's `Served`, `config` its `ServerConfig`.
"""

from __future__ import annotations

from typing import Any, Callable

from . import anthropic, chat_completions, responses


def handlers(ctx: Callable[[], Any], config) -> dict[str, Callable]:
    return {
        "chat_completions": lambda body: chat_completions.complete(ctx(), config, body),
        "apply_template": lambda body: chat_completions.apply_template(ctx(), config, body),
        "chat_input_tokens": lambda body: chat_completions.input_tokens(ctx(), config, body),
        "anthropic_messages": lambda body: anthropic.messages(ctx(), config, body),
        "anthropic_count_tokens": lambda body: anthropic.count_tokens(ctx(), config, body),
        "responses": lambda body: responses.create(ctx(), config, body),
        "responses_input_tokens": lambda body: responses.input_tokens(ctx(), config, body),
    }

"""The chat surfaces' handler entries, merged into server/app.py's table.

Each entry takes the request body (`body`) when its Route reads one, then
the route's path parameters by name (protocol/routes.py); `ctx` gives the
running server's `Served`, `config` its `ServerConfig`, `state` the app's
registries and stored responses (server/state.py).
"""

from __future__ import annotations

from typing import Any, Callable

from . import anthropic, openai_chat as chat_completions, responses
from ..http.key_scope import caller_scope as scope
from ..request.served import Served
from ..state import AppState


def handlers(ctx: Callable[[], Served], config, state: AppState) -> dict[str, Callable[..., Any]]:
    store = state.responses
    return {
        "chat_completions": lambda body: chat_completions.complete(ctx(), config, body, scope()),
        "chat_control": lambda body: state.control.control(body, scope()),
        "apply_template": lambda body: chat_completions.apply_template(ctx(), config, body),
        "chat_input_tokens": lambda body: chat_completions.input_tokens(ctx(), config, body),
        "anthropic_messages": lambda body: anthropic.messages(ctx(), config, body),
        "anthropic_count_tokens": lambda body: anthropic.count_tokens(ctx(), config, body),
        "responses": lambda body: responses.create(ctx(), config, body, store, scope()),
        "responses_input_tokens": lambda body: responses.input_tokens(ctx(), config, body,
                                                                      store, scope()),
        "responses_retrieve": lambda response_id: responses.retrieve(store, scope(), response_id),
        "responses_cancel": lambda response_id: responses.cancel(store, scope(), response_id),
    }

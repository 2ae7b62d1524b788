"""POST /tokenize and POST /detokenize."""

from __future__ import annotations

from functools import partial
from typing import Any

from ..http.errors import json_response, type_error
from ..request.served import Served, off_loop


def _flag(body: dict, key: str, default: bool) -> bool:
    value = body.get(key, default)
    return value if isinstance(value, bool) else default


def _piece(vocab, token_id: int):
    """A JSON string when the bytes are valid UTF-8, else the byte values."""
    raw = vocab.piece(token_id)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def _is_id(x) -> bool:
    # nlohmann's get<llama_token>() takes any number or a boolean
    return isinstance(x, (int, float))


def _check_content(content) -> None:
    """tokenize_mixed's reads: a string, or an array of strings and ids."""
    if isinstance(content, list):
        for part in content:
            if not isinstance(part, str) and not _is_id(part):
                raise type_error("number", part)
    elif not isinstance(content, str):
        raise type_error("string", content)


async def tokenize(served: Served, body: Any):
    """POST /tokenize; the tokenizing runs off the event loop (off_loop), so
    a huge body never stalls it."""
    vocab = served.bridge.vocab
    body = body if isinstance(body, dict) else {}
    content = body.get("content")
    if content is None:
        return json_response({"tokens": []})
    _check_content(content)
    ids = await off_loop(served, partial(
        vocab.tokenize_mixed, content, add_special=_flag(body, "add_special", False),
        parse_special=_flag(body, "parse_special", True)))
    if _flag(body, "with_pieces", False):
        return json_response({"tokens": [{"id": t, "piece": _piece(vocab, t)} for t in ids]})
    return json_response({"tokens": ids})


def detokenize(vocab, body: Any):
    body = body if isinstance(body, dict) else {}
    tokens = body.get("tokens")
    if tokens is None:
        return json_response({"content": ""})
    if not isinstance(tokens, list):
        raise type_error("array", tokens)
    for t in tokens:
        if not _is_id(t):
            raise type_error("number", t)
    ids = [int(t) for t in tokens]
    return json_response({"content": vocab.detokenize(ids)})

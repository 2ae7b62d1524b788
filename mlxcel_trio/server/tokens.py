"""POST /tokenize and POST /detokenize."""

from __future__ import annotations

from typing import Any

from .errors import json_response


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


def tokenize(vocab, body: Any):
    body = body if isinstance(body, dict) else {}
    content = body.get("content")
    if content is None:
        return json_response({"tokens": []})
    ids = vocab.tokenize_mixed(content, add_special=_flag(body, "add_special", False),
                               parse_special=_flag(body, "parse_special", True))
    if _flag(body, "with_pieces", False):
        return json_response({"tokens": [{"id": t, "piece": _piece(vocab, t)} for t in ids]})
    return json_response({"tokens": ids})


def detokenize(vocab, body: Any):
    body = body if isinstance(body, dict) else {}
    tokens = body.get("tokens")
    if not isinstance(tokens, list):
        return json_response({"content": ""})
    ids = [t for t in tokens if isinstance(t, int) and not isinstance(t, bool)]
    return json_response({"content": vocab.detokenize(ids)})

"""Which API key a request came with, as a scope for per-key state.

With more than one --api-key, state one request leaves behind (a stored
response, a live completion's control entry, a stream session) belongs to
the key that made it, and another key sees it exactly as an unknown id.
With zero or one key every caller shares one scope, as upstream treats all
keys as one.  The scope is the index of the matching key, which the gate in
server/app.py found with its constant-time compare (http/app_shell.py) (`g.key_scope`, set only
with more than one key); the key itself is never kept.
"""

from __future__ import annotations

from quart import g


def key_scope() -> int:
    """The index of the API key the request authenticated with when more
    than one is configured; else 0 (every key is one trust domain)."""
    return getattr(g, "key_scope", 0)


def caller_scope() -> str:
    """key_scope as the string the chat-side registries key on."""
    return str(key_scope())

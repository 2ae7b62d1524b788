"""Which API key a request came with, as a scope for per-key state.

With more than one --api-key, state one request leaves behind (a stored
response, a live completion's control entry, a stream session) belongs to
the key that made it, and another key sees it exactly as an unknown id.
With zero or one key every caller shares one scope, as upstream treats all
keys as one.  The scope is the index of the matching key, which the gate in
server/app.py found with its constant-time compare (`g.stream_owner`, the
same owner stream sessions use); the key itself is never kept.
"""

from __future__ import annotations

from quart import g


def caller_scope(api_keys) -> str:
    if len(api_keys) <= 1:
        return ""
    return str(getattr(g, "stream_owner", 0))

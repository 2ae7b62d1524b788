"""Realtime reasoning control: POST /v1/chat/completions/control.

A chat completion is registered under its `chatcmpl-...` id for as long as
its request runs (upstream: while its slot is processing), armed or not; a
request with `reasoning_control: true` and a template that thinks carries a
`ForceEnd` (chat/budget.py) that the control action sets.  The engine reads
that flag before its next draw, so the close (the budget message, then the
end marker) is forced exactly as an exhausted --reasoning-budget forces it.

Upstream's contract, key for key: 400 "missing completion id" and 400
"unknown control action" before any lookup; otherwise 200 with
{"success": false, "message": "no active completion for this id"} for an
id that is unknown, finished, or another API key's (server/scope.py),
{"success": false, "message": "reasoning control not enabled for this
completion"} for one that was not armed, and {"success": true} once the
flag is set (whether or not the model is still thinking: upstream's force
is a no-op outside the block and still answers success).
"""

from __future__ import annotations

from typing import Any

from quart import Response

from ..bridge import REQUEST_CLEANUPS
from ..chat.budget import ForceEnd
from .errors import ApiError, json_response

# id -> (scope, flag or None when not armed); entries live while their request does
_LIVE: dict[str, tuple[str, ForceEnd | None]] = {}


def register(cid: str, scope: str, force_end: ForceEnd | None) -> None:
    """Make `cid` controllable until the current request ends."""
    _LIVE[cid] = (scope, force_end)
    cleanups = REQUEST_CLEANUPS.get()
    if cleanups is not None:
        cleanups.append(lambda: _LIVE.pop(cid, None))


def control(body: Any, scope: str) -> Response:
    body = body if isinstance(body, dict) else {}
    cid = body.get("id") if isinstance(body.get("id"), str) else ""
    action = body.get("action") if isinstance(body.get("action"), str) else ""
    if not cid:
        raise ApiError("missing completion id")
    if action != "reasoning_end":
        raise ApiError("unknown control action")
    live = _LIVE.get(cid)
    if live is None or live[0] != scope:
        return json_response({"success": False, "message": "no active completion for this id"})
    if live[1] is None:
        return json_response({"success": False,
                              "message": "reasoning control not enabled for this completion"})
    live[1].request()
    return json_response({"success": True})

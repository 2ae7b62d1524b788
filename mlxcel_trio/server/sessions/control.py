"""Realtime reasoning control: POST /v1/chat/completions/control.

A chat completion is registered under its `chatcmpl-...` id for as long as
its generation runs (upstream: while its slot is processing), armed or not:
a streamed one until its jobs end, whoever then holds them (a stream session
of server/sessions/streams.py outlives its request), a non-streamed one until its
request ends.  Finished streamed entries are dropped on the next
registration, so the table holds only what is live; an armed
request (`reasoning_control: true`) is registered with its job ids, and the
control action has the bridge post a `ForceEnd` command for them.  The
engine applies it before the jobs' next draw, so the close (the budget
message, then the end marker) is forced exactly as an exhausted
--reasoning-budget forces it.

Upstream's contract, key for key: 400 "missing completion id" and 400
"unknown control action" before any lookup; otherwise 200 with
{"success": false, "message": "no active completion for this id"} for an
id that is unknown, finished, or another API key's (server/http/key_scope.py),
{"success": false, "message": "reasoning control not enabled for this
completion"} for one that was not armed, and {"success": true} once the
command is posted (whether or not the model is still thinking: upstream's force
is a no-op outside the block and still answers success).
"""

from __future__ import annotations

from typing import Any

from quart import Response

from ...bridge import REQUEST_CLEANUPS, Bridge, JobHandle
from ..http.errors import ApiError, json_response

# id -> (scope, the job ids to force-end or None when not armed, the streamed
# jobs' handle or None)
_LIVE: dict[str, tuple[str, tuple[int, ...] | None, JobHandle | None]] = {}


def _alive(entry) -> bool:
    return entry[2] is None or entry[2].live()


def register(cid: str, scope: str, force_end: tuple[int, ...] | None,
             handle: JobHandle | None = None) -> None:
    """Make `cid` controllable while its jobs run (`handle`: a stream's), or
    until the current request ends (no handle: a non-streamed request)."""
    for old in [k for k, e in _LIVE.items() if not _alive(e)]:
        del _LIVE[old]
    _LIVE[cid] = (scope, force_end, handle)
    cleanups = REQUEST_CLEANUPS.get()
    if handle is None and cleanups is not None:
        cleanups.append(lambda: _LIVE.pop(cid, None))


def control(body: Any, scope: str, bridge: Bridge) -> Response:
    body = body if isinstance(body, dict) else {}
    cid = body.get("id") if isinstance(body.get("id"), str) else ""
    action = body.get("action") if isinstance(body.get("action"), str) else ""
    if not cid:
        raise ApiError("missing completion id")
    if action != "reasoning_end":
        raise ApiError("unknown control action")
    live = _LIVE.get(cid)
    if live is not None and not _alive(live):
        del _LIVE[cid]
        live = None
    if live is None or live[0] != scope:
        return json_response({"success": False, "message": "no active completion for this id"})
    if live[1] is None:
        return json_response({"success": False,
                              "message": "reasoning control not enabled for this completion"})
    bridge.force_end(live[1])
    return json_response({"success": True})

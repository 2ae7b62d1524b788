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

import attrs
from quart import Response

from ...bridge import Bridge, JobHandle
from ..http.errors import ApiError, json_response
from ..http.resources import RequestResources
from .memory_store import MemoryStore
from .session_store import SessionStore
from .store_transport import StoreDown


@attrs.frozen
class LiveCompletion:
    """One controllable completion."""

    scope: str                          # the API key scope that may control it
    job_ids: tuple[int, ...] | None     # the jobs to force-end; None: not armed
    handle: JobHandle | None            # a stream's jobs; None: lives until its request ends

    def alive(self) -> bool:
        return self.handle is None or self.handle.live()


class ControlRegistry:
    """The completions POST /v1/chat/completions/control can reach, by id;
    one per app (server/state.py).  A control action is a command on the
    engine's queue, posted through `bridge`."""

    def __init__(self, bridge: Bridge, shared: SessionStore | None = None) -> None:
        self._bridge = bridge
        self._live: dict[str, LiveCompletion] = {}
        # With a shared store, a control request may reach any replica: the
        # entry is published (owner, scope, armed) and the action forwarded
        # to the owner's control stream, which posts the same ForceEnd (a
        # store without peers publishes nothing and finds no other entry).
        self._shared: SessionStore = shared or MemoryStore()
        self._shared.on_control("reasoning_end", self._forwarded)
        self._shared.on_tick(self._sweep)   # a finished stream's entry leaves the store soon

    def __len__(self) -> int:
        return len(self._live)

    def register(self, cid: str, scope: str, job_ids: tuple[int, ...] | None, *,
                 handle: JobHandle | None = None,
                 request: RequestResources | None = None) -> None:
        """Make `cid` controllable while its jobs run (`handle`: a stream's,
        whoever holds it later), or until `request` ends (no handle: a
        non-streamed request)."""
        for old in [k for k, e in self._live.items() if not e.alive()]:
            self.drop(old)
        self._live[cid] = LiveCompletion(scope, job_ids, handle)
        if handle is None and request is not None:
            request.on_close(lambda: self.drop(cid))
        shared, armed = self._shared, job_ids is not None
        shared.defer(lambda: shared.register_completion(cid, scope, armed))

    def drop(self, cid: str) -> None:
        if self._live.pop(cid, None) is not None:
            shared = self._shared
            shared.defer(lambda: shared.drop_completion(cid))

    def _sweep(self) -> None:
        for cid in [k for k, e in self._live.items() if not e.alive()]:
            self.drop(cid)

    def _forwarded(self, msg: dict[str, str]) -> None:
        live = self.find(msg.get("cid", ""), msg.get("scope", ""))
        if live is not None and live.job_ids is not None:
            self._bridge.force_end(live.job_ids)

    def find(self, cid: str, scope: str) -> LiveCompletion | None:
        """The live entry for `cid` under `scope`; another key's is unknown."""
        live = self._live.get(cid)
        if live is not None and not live.alive():
            self.drop(cid)
            live = None
        return live if live is not None and live.scope == scope else None

    async def control(self, body: Any, scope: str) -> Response:
        """The route."""
        body = body if isinstance(body, dict) else {}
        cid = body.get("id") if isinstance(body.get("id"), str) else ""
        action = body.get("action") if isinstance(body.get("action"), str) else ""
        if not cid:
            raise ApiError("missing completion id")
        if action != "reasoning_end":
            raise ApiError("unknown control action")
        live = self.find(cid, scope)
        if live is None:
            return await self._remote(cid, scope)
        if live.job_ids is None:
            return json_response({"success": False,
                                  "message": "reasoning control not enabled for this completion"})
        self._bridge.force_end(live.job_ids)
        return json_response({"success": True})

    async def _remote(self, cid: str, scope: str) -> Response:
        """Another replica's completion, through the shared store."""
        try:
            entry = await self._shared.find_completion(cid)
            if entry is None or entry.get("scope") != scope or \
                    not await self._shared.owner_alive(entry["replica"]):
                return json_response({"success": False,
                                      "message": "no active completion for this id"})
            if not entry.get("armed"):
                return json_response({"success": False, "message":
                                      "reasoning control not enabled for this completion"})
            await self._shared.send_control(entry["replica"], "reasoning_end", cid=cid,
                                            scope=scope)
        except StoreDown:
            raise ApiError(f"the session store ({self._shared.shown}) is unavailable; this "
                           "completion may run on another replica", "unavailable_error")
        return json_response({"success": True})

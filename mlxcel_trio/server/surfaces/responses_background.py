"""Background Responses (`background: true`): the generation runs as
detached work (sessions/detached.py) with its own cancel scope, so POST
answers at once (status "queued"), GET follows its stored entry and POST
/v1/responses/:id/cancel stops it.

With a session store that `continues` (file://, Redis) the run is also a
stream session of its own, so it outlives its process as a resumable
stream does (sessions/takeover.py).  The session's id is
response_store.SESSION_PREFIX + the response id, in the caller's key
scope; its request record is the POST's (body, headers, and the request's
draws: the response id, its creation time, its item ids); its frames are
the Responses stream's events (responses_shapes.Renderer), which no client
needs to read (GET /v1/stream?conv_id=<that id> can).  When its process
dies, a live replica (or the server restarted on the same file://
directory) claims the session and rebuilds the POST with a Continuation in
its scope: `create` comes here again, the job replays the published token
ids, and the renderer's final callback stores the completed response under
the same id, with the same item ids.  Meanwhile GET through any replica
answers "in_progress" (response_store.py asks the stream registry whether
the session will be continued); one that cannot be continued answers
"failed" with the reason.  Without such a store the run is plain detached
work, and it ends with its process.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Awaitable, Callable

import trio
from quart import Response, request

from ...chat.parser import ChatMsg
from ..http import request_tape
from ..http.errors import ApiError, json_response
from ..http.key_scope import key_scope
from ..http.sse import error_frame, event_stream, first_event
from ..request.jobs import run_all
from ..request.served import Served
from ..sessions.response_store import SESSION_PREFIX, ResponseStore, Stored
from ..sessions.takeover import Continuation, Tap, continuation, request_record
from .openai_chat import final_message
from .responses_shapes import Renderer, assistant_turn, output_items, response_object, usage

log = logging.getLogger("mlxcel.http")

HANDED = object()   # the run's session was handed to a peer (SIGTERM): its entry stays live


async def start(served: Served, chat, job, values, store: ResponseStore, scope: str, rid: str,
                created: int, turns: list, extra: dict) -> Response:
    """Queue the generation as detached work; its entry is what GET sees."""
    plan = continuation(request.scope)
    scope_cs = trio.CancelScope()
    entry = Stored(response_object(served, rid, created,
                                   "queued" if plan is None else "in_progress", [], None, extra),
                   turns, True, scope_cs.cancel)
    if served.state.streams.shared.continues:
        generate = await _in_session(served, chat, job, values, store, scope, rid, created,
                                     turns, extra, entry, plan)
    else:
        generate = _plain(served, chat, job, rid, created, turns, extra, entry)
    queued = trio.Event()   # the "queued" state is written before any later one

    async def run() -> None:
        obj: Any = None
        with scope_cs:
            await queued.wait()
            entry.obj["status"] = "in_progress"
            await store.keep(scope, rid, entry)
            try:
                obj = await generate()
            except ApiError as err:
                obj = _failed(served, rid, created, extra, err.type, err.message)
            except Exception as err:  # a failed run is recorded, never raised
                log.exception("background response %s failed", rid)
                obj = _failed(served, rid, created, extra, "server_error", str(err))
        if obj is HANDED:
            return
        entry.cancel = None
        if scope_cs.cancelled_caught or obj is None:
            obj = {**entry.obj, "status": "cancelled"}
        entry.obj = obj
        with trio.CancelScope(shield=True):   # the final state reaches the store
            await store.keep(scope, rid, entry)

    served.state.detached.start(run, name=f"background response {rid}")
    try:
        await store.keep(scope, rid, entry)  # after start: a refused start leaves nothing queued
    finally:
        queued.set()
    return json_response(entry.obj)


def _failed(served: Served, rid: str, created: int, extra: dict, code: str,
            message: str) -> dict:
    return response_object(served, rid, created, "failed", [], None,
                           {**extra, "error": {"code": code, "message": message}})


def _plain(served: Served, chat, job, rid: str, created: int, turns: list, extra: dict,
           entry: Stored) -> Callable[[], Awaitable[Any]]:
    async def generate() -> dict:
        (fin,) = await run_all(served, [job])
        msg = final_message(chat, fin.content)
        entry.history = turns + [assistant_turn(msg)]
        return response_object(served, rid, created, "completed", output_items(msg),
                               usage(fin), extra)
    return generate


async def _in_session(served: Served, chat, job, values, store: ResponseStore, scope: str,
                      rid: str, created: int, turns: list, extra: dict, entry: Stored,
                      plan: Continuation | None) -> Callable[[], Awaitable[Any]]:
    """The run as a stream session (the module docstring).  Runs in the
    request: the renderer's ids are drawn here, where the request's tape
    records (or, continued, plays back) them.  ApiError when a
    continuation cannot go on (the takeover then ends its session)."""
    sessions = served.state.streams
    owner, cid = key_scope(), SESSION_PREFIX + rid
    jobs = plan.jobs([job]) if plan is not None else [job]
    tap = Tap(jobs, plan)
    result: dict[str, dict] = {}

    def finished(msg: ChatMsg, obj: dict) -> None:
        # published before the session's last chunk is written (the store's
        # writer runs publications first), so a session whose final frame is
        # in the log always has its completed response stored
        entry.history = turns + [assistant_turn(msg)]
        entry.obj, entry.cancel = obj, None
        result["obj"] = obj
        store.publish(scope, rid, entry)

    renderer = Renderer(served, chat, rid, values.timings_per_token, created, extra, finished)
    render = tap.render(renderer.render)
    if plan is None:
        tap.record(request_record(request, await request.get_data(), owner,
                                  request_tape.current()))
    stop = entry.cancel

    def cancel() -> None:   # the run and its session's producer
        if stop is not None:
            stop()
        sessions.cancel(owner, cid)
    entry.cancel = cancel
    entry.session = cid

    async def generate() -> Any:
        handle = served.bridge.open(*jobs)
        try:
            first = await first_event(handle)
            session = await sessions.open(owner, cid, handle,
                                          event_stream(handle, first, render, 0.0), None, tap)
        except BaseException as exc:
            handle.close()
            if plan is not None:   # the restored session ends here
                sessions.end_continued(plan.session, error_frame(exc) if isinstance(
                    exc, ApiError) else b"")
            raise
        last = b""
        async for chunk in session.follow(session.total_bytes):
            last = chunk
        if "obj" in result:
            return result["obj"]
        if session.handed_off:
            return HANDED
        raise ApiError(_error_message(last) or "the generation ended without a result",
                       "server_error")
    return generate


def _error_message(chunk: bytes) -> str:
    """The message of the error frame that ended a session, if it did."""
    for block in reversed(chunk.split(b"\n\n")):
        if block.startswith(b"data: "):
            try:
                return str(json.loads(block[6:])["error"]["message"])
            except (ValueError, KeyError, TypeError):
                return ""
    return ""

"""POST /v1/responses (and /responses) and the Responses input-token count.

As upstream, a Responses body is translated into a chat-completions body
(`to_chat_body`: `instructions` -> a system message, `input` items ->
messages, function tools -> chat tools, `max_output_tokens` -> max_tokens,
`reasoning.effort` -> reasoning_effort) and runs the chat path.  The reply
is a `response` object whose output items are a reasoning item, a message
item and one function_call item per tool call.  A stream sends
response.created / response.in_progress, then output_item.added,
content_part.added and the reasoning_text / output_text /
function_call_arguments deltas as they come, the matching .done events and
response.completed, each as `event: <type>` plus `data:`.

Unlike upstream (which refuses `previous_response_id` and keeps nothing),
responses are stored as OpenAI stores them (server/sessions/response_store.py):
`previous_response_id` continues a stored conversation, GET
/v1/responses/:id answers a stored response, and `background: true` runs the
generation as detached work (responses_background.py: with a session store
that continues, it outlives its process), so POST answers at once (status
"queued"), GET follows it, and POST /v1/responses/:id/cancel stops it.  As
OpenAI's contract says, only a background response can be cancelled.  The
shapes and the stream's renderer are responses_shapes.py's.
"""

from __future__ import annotations

import logging
from typing import Any

from quart import Response

from ...chat.parser import ChatMsg
from .openai_chat import chat_plan, final_message, plan_jobs, random_string
from ..request.chat_checks import bad
from ..request.jobs import now_s, run_all
from ..request.served import Served
from ..http.errors import ApiError, json_response
from ..sessions.response_store import MAX_BACKGROUND, ResponseStore, Stored
from . import responses_background
from .responses_shapes import Renderer, assistant_turn, output_items, response_object, usage
from .streaming import stream_jobs

log = logging.getLogger("mlxcel.http")

_ROLES_IN = ("user", "system", "developer")


def _is(obj: Any, key: str, kind: type) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get(key), kind)


def _input_message(item: dict) -> dict:
    content = []
    for part in item["content"]:
        kind = part.get("type") if isinstance(part, dict) and isinstance(part.get("type"), str) \
            else ""
        if kind == "input_text":
            if "text" not in part:
                raise bad("'Input text' requires 'text'")
            content.append({"text": part["text"], "type": "text"})
        elif kind == "input_image":
            if "image_url" not in part:
                raise bad("'image_url' is required")
            content.append({"image_url": {"url": part["image_url"]}, "type": "image_url"})
        elif kind == "input_file":
            raise bad("'input_file' is not supported by llamacpp at this moment")
        else:
            raise bad("'type' must be one of 'input_text', 'input_image', or 'input_file'")
    msg = {k: v for k, v in item.items() if k not in ("type", "status")}
    msg["content"] = content
    return msg


def _output_content(item: dict) -> list:
    content: list = []
    if isinstance(item.get("content"), str):
        content.append({"text": item["content"], "type": "text"})
    elif isinstance(item.get("content"), list):
        for part in item["content"]:
            kind = part.get("type") if _is(part, "type", str) else ""
            if kind in ("output_text", "input_text"):
                if not _is(part, "text", str):
                    raise bad("'Output text' requires 'text'")
                content.append({"text": part["text"], "type": "text"})
            elif kind == "refusal":
                if not _is(part, "refusal", str):
                    raise bad("'Refusal' requires 'refusal'")
                content.append({"refusal": part["refusal"], "type": "refusal"})
            else:
                raise bad("'type' must be one of 'output_text' or 'refusal'")
    return content


def _items(items: list) -> list:
    out: list = []
    for item in items:
        merge = bool(out) and isinstance(out[-1], dict) and out[-1].get("role") == "assistant"
        if _is(item, "content", str):
            item = {**item, "content": [{"text": item["content"], "type": "input_text"}]}
        if _is(item, "content", list) and _is(item, "role", str) and item["role"] in _ROLES_IN:
            out.append(_input_message(item))
        elif _is(item, "role", str) and item["role"] == "assistant" and \
                _is(item, "type", str) and item["type"] == "message":
            content = _output_content(item)
            if merge:
                prev = out[-1]
                if not isinstance(prev.get("content"), list):
                    prev["content"] = []
                prev["content"] += content
            else:
                out.append({**{k: v for k, v in item.items() if k not in ("status", "type")},
                            "content": content})
        elif all(_is(item, k, str) for k in ("arguments", "call_id", "name", "type")) and \
                item["type"] == "function_call":
            call = {"function": {"arguments": item["arguments"], "name": item["name"]},
                    "id": item["call_id"], "type": "function"}
            if merge:
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "tool_calls": [call]})
        elif _is(item, "call_id", str) and (_is(item, "output", str) or _is(item, "output", list)) \
                and _is(item, "type", str) and item["type"] == "function_call_output":
            output = item["output"]
            if isinstance(output, list):
                converted = []
                for part in output:
                    if not _is(part, "type", str) or part["type"] != "input_text":
                        raise bad("Output of tool call should be 'Input text'")
                    converted.append({**part, "type": "text"})
                output = converted
            out.append({"content": output, "role": "tool", "tool_call_id": item["call_id"]})
        elif _is(item, "summary", list) and _is(item, "type", str) and item["type"] == "reasoning":
            if not _is(item, "content", list):
                raise bad("item['content'] is not an array")
            if not item["content"]:
                raise bad("item['content'] is empty")
            if not _is(item["content"][0], "text", str):
                raise bad("item['content']['text'] is not a string")
            text = item["content"][0]["text"]
            if merge:
                out[-1]["reasoning_content"] = text
            else:
                out.append({"role": "assistant", "content": [], "reasoning_content": text})
        else:
            raise bad("Cannot determine type of 'item'")
    return out


def to_chat_body(body: Any, history: list | None = None) -> dict:
    """server_chat_convert_responses_to_chatcmpl; `history` (the chat
    messages of a stored previous response) goes after the instructions."""
    if not isinstance(body, dict) or "input" not in body:
        raise bad("'input' is required")
    for key in ("n", "n_cmpl"):
        if body.get(key) not in (None, 1):
            raise bad(f"'{key}' must be 1 on this route: a response carries one output")
    chat = {k: v for k, v in body.items()
            if k not in ("input", "instructions", "text", "previous_response_id", "store",
                         "background")}
    fmt = body["text"].get("format") if isinstance(body.get("text"), dict) else None
    if _is(fmt, "type", str) and fmt["type"] == "json_schema":
        # structured output: the chat route's response_format (upstream ignores text)
        chat["response_format"] = {"type": "json_schema",
                                   "json_schema": {"schema": fmt.get("schema", {})}}
    elif _is(fmt, "type", str) and fmt["type"] == "json_object":
        chat["response_format"] = {"type": "json_object"}
    messages: list = []
    if "instructions" in body:
        messages.append({"role": "system", "content": body["instructions"]
                         if isinstance(body["instructions"], str) else ""})
    messages += history or []
    value = body["input"]
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
    elif isinstance(value, list):
        messages += _items(value)
    else:
        raise bad("'input' must be a string or array of objects")
    chat["messages"] = messages
    if "tools" in body:
        if not isinstance(body["tools"], list):
            raise bad("'tools' must be an array of objects")
        tools = []
        for tool in body["tools"]:
            if not _is(tool, "type", str) or tool["type"] != "function":
                continue  # no chat-completions equivalent (upstream logs and skips)
            fn = {k: v for k, v in tool.items() if k != "type"}
            fn.setdefault("strict", True)
            tools.append({"type": "function", "function": fn})
        del chat["tools"]
        if tools:
            chat["tools"] = tools
    if "max_output_tokens" in body:
        del chat["max_output_tokens"]
        chat["max_tokens"] = body["max_output_tokens"]
    if "reasoning" in body:
        if isinstance(body["reasoning"], dict) and "effort" in body["reasoning"]:
            chat["reasoning_effort"] = body["reasoning"]["effort"]
        del chat["reasoning"]
    return chat


# -- routes -------------------------------------------------------------------------------

async def _previous(body: Any, store: ResponseStore, scope: str) -> Stored | None:
    rid = body.get("previous_response_id") if isinstance(body, dict) else None
    if not isinstance(rid, str) or not rid:
        return None
    prev = await store.fetch(scope, rid)
    if prev is None or prev.live:
        raise bad(f"Previous response with id '{rid}' not found.")
    return prev


def _turns(body: dict, chat_body: dict) -> list:
    """The conversation a stored response carries on: everything but the
    instructions, which are not carried over."""
    return chat_body["messages"][1 if "instructions" in body else 0:]


async def create(served: Served, config, body: Any, store: ResponseStore,
                 scope: str) -> Response:
    prev = await _previous(body, store, scope)
    chat_body = to_chat_body(body, prev.history if prev else None)
    keep = body.get("store") is not False
    background = body.get("background") is True
    extra: dict[str, Any] = {}
    if prev is not None:
        extra["previous_response_id"] = body["previous_response_id"]
    if background:
        if body.get("stream") is True:
            raise bad("'background' responses cannot be streamed here: poll "
                      "GET /v1/responses/:id instead")
        if not keep:
            raise bad("'background' requires 'store' to be true")
        if store.live_background() >= MAX_BACKGROUND:
            raise ApiError(f"too many background responses in progress (at most "
                           f"{MAX_BACKGROUND})", "unavailable_error")
        extra["background"] = True
    chat, values, (job,) = await plan_jobs(served, config, chat_body)
    rid, created = "resp_" + random_string(), now_s()
    turns = _turns(body, chat_body)

    def finished(msg: ChatMsg, obj: dict) -> None:
        if keep:
            store.publish(scope, rid, Stored(obj, turns + [assistant_turn(msg)], background))

    if background:
        return await responses_background.start(served, chat, job, values, store, scope, rid,
                                                created, turns, extra)
    if not chat.stream:
        (fin,) = await run_all(served, [job])
        msg = final_message(chat, fin.content)
        obj = response_object(served, rid, created, "completed", output_items(msg), usage(fin),
                              extra)
        if keep:  # stored (everywhere) before the answer
            await store.keep(scope, rid, Stored(obj, turns + [assistant_turn(msg)], background))
        return json_response(obj)
    renderer = Renderer(served, chat, rid, values.timings_per_token, created, extra,
                         finished)
    return await stream_jobs(served, [job], renderer.render, values.sse_ping_interval)


async def _lookup(store: ResponseStore, scope: str, rid: str) -> Stored:
    stored = await store.fetch(scope, rid)
    if stored is None:
        raise ApiError(f"Response with id '{rid}' not found.", "not_found_error")
    return stored


async def retrieve(store: ResponseStore, scope: str, rid: str) -> Response:
    return json_response((await _lookup(store, scope, rid)).obj)


async def cancel(store: ResponseStore, scope: str, rid: str) -> Response:
    """OpenAI's contract: only a background response can be cancelled; a
    finished one is answered unchanged."""
    stored = await _lookup(store, scope, rid)
    if not stored.background:
        raise bad("Only responses created with background=true can be cancelled.")
    if stored.live and await store.cancel_remote(scope, rid, stored):
        return json_response({**stored.obj, "status": "cancelled"})
    if stored.live and stored.cancel is not None:
        stored.cancel()
        stored.obj = {**stored.obj, "status": "cancelled"}
    return json_response(stored.obj)


async def input_tokens(served: Served, config, body: Any, store: ResponseStore,
                 scope: str) -> Response:
    prev = await _previous(body, store, scope)
    chat = await chat_plan(served, config, to_chat_body(body, prev.history if prev else None),
                     generating=False)
    return json_response({"input_tokens": len(chat.tokens), "object": "response.input_tokens"})

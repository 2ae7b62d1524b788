"""The Anthropic Messages and OpenAI Responses surfaces in-process, with the
stored-response routes (server/surfaces/anthropic.py, responses.py)."""

from __future__ import annotations

import pytest

from mlxcel_trio.protocol.records import Cancel

from .conftest import JSON_TYPE, MODEL_NAME, SSE_TYPE, each_route, error_of
from .fake_engine import fail, reply

route = pytest.mark.route
USER = {"role": "user", "content": "Hello"}
MESSAGE_KEYS = ["id", "type", "role", "content", "model", "stop_reason", "stop_sequence",
                "usage"]
RESPONSES = ("POST /v1/responses", "POST /responses")


# -- Anthropic ------------------------------------------------------------------------------

@route("POST /v1/messages")
async def test_messages_object(serve):
    s = await serve(script=reply("<think>hm</think>Hi!"))
    r = await s.post("/v1/messages", {"messages": [USER], "max_tokens": 16})
    assert r.status_code == 200 and r.content_type == JSON_TYPE
    res = await r.get_json()
    assert list(res) == MESSAGE_KEYS and res["type"] == "message" and res["model"] == MODEL_NAME
    assert [b["type"] for b in res["content"]] == ["thinking", "text"]
    assert res["content"][1]["text"] == "Hi!" and res["stop_reason"] == "end_turn"
    assert list(res["usage"]) == ["cache_read_input_tokens", "input_tokens", "output_tokens"]


@route("POST /v1/messages")
async def test_messages_stream_events_are_named(serve):
    s = await serve(script=reply("Hi!"))
    st = await s.sse("/v1/messages", {"messages": [USER], "max_tokens": 16, "stream": True})
    assert st.status_code == 200 and st.headers["Content-Type"] == SSE_TYPE
    events = st.events()
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert all(name == data["type"] for name, data in events)
    text = "".join(d["delta"].get("text", "") for n, d in events if n == "content_block_delta")
    assert text == "Hi!" and b"[DONE]" not in st.body


@route("POST /v1/messages")
async def test_messages_errors(serve):
    s = await serve()
    r = await s.post("/v1/messages", {"max_tokens": 1})
    assert error_of(await r.get_json(), 400, "invalid_request_error") == "'messages' is required"
    late = await serve(script=fail("server_error", "boom", after=1))
    st = await late.sse("/v1/messages", {"messages": [USER], "stream": True})
    name, data = st.events()[-1]
    assert name == "error" and data == {"code": 500, "message": "boom", "type": "server_error"}


@route("POST /v1/messages/count_tokens")
async def test_count_tokens(serve):
    s = await serve()
    r = await s.post("/v1/messages/count_tokens", {"messages": [USER], "system": "Be brief."})
    assert r.status_code == 200 and r.content_type == JSON_TYPE
    res = await r.get_json()
    assert list(res) == ["input_tokens"] and res["input_tokens"] > 0
    r = await s.post("/v1/messages/count_tokens", {})
    assert error_of(await r.get_json(), 400, "invalid_request_error") == "'messages' is required"


# -- Responses ------------------------------------------------------------------------------

@each_route(*RESPONSES)
async def test_response_object(serve, path):
    s = await serve(script=reply("Hello back"))
    r = await s.post(path, {"input": "Hello"})
    assert r.status_code == 200 and r.content_type == JSON_TYPE
    res = await r.get_json()
    assert res["object"] == "response" and res["status"] == "completed"
    assert res["id"].startswith("resp_") and res["model"] == MODEL_NAME
    (item,) = res["output"]
    assert item["type"] == "message" and item["role"] == "assistant"
    assert item["content"][0]["text"] == "Hello back"


@each_route(*RESPONSES)
async def test_response_stream_events(serve, path):
    s = await serve(script=reply("Hello back"))
    st = await s.sse(path, {"input": "Hello", "stream": True})
    assert st.status_code == 200 and st.headers["Content-Type"] == SSE_TYPE
    names = [name for name, _ in st.events()]
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] == "response.completed"
    deltas = [d["delta"] for n, d in st.events() if n == "response.output_text.delta"]
    assert "".join(deltas) == "Hello back"


@each_route(*RESPONSES)
@pytest.mark.parametrize("body,message", [
    ({}, "'input' is required"),
    ({"input": 5}, "'input' must be a string or array of objects"),
    ({"input": "x", "previous_response_id": "resp_1"},
     "Previous response with id 'resp_1' not found."),
    ({"input": [{"type": "mystery"}]}, "Cannot determine type of 'item'"),
    ({"input": "x", "background": True, "store": False},
     "'background' requires 'store' to be true"),
])
async def test_response_refusals(serve, path, body, message):
    s = await serve()
    r = await s.post(path, body)
    assert error_of(await r.get_json(), 400, "invalid_request_error") == message


@each_route(*RESPONSES)
async def test_response_engine_failure(serve, path):
    s = await serve(script=fail("exceed_context_size_error", "too long",
                                (("n_prompt_tokens", 9), ("n_ctx", 4))))
    r = await s.post(path, {"input": "Hello"})
    assert r.status_code == 400 and await r.get_json() == {"error": {
        "code": 400, "message": "too long", "type": "exceed_context_size_error",
        "n_prompt_tokens": 9, "n_ctx": 4}}


@each_route("POST /responses/input_tokens", "POST /v1/responses/input_tokens")
async def test_response_input_tokens(serve, path):
    s = await serve()
    r = await s.post(path, {"input": "Hello"})
    assert r.status_code == 200 and r.content_type == JSON_TYPE
    res = await r.get_json()
    assert res["object"] == "response.input_tokens" and res["input_tokens"] > 0
    r = await s.post(path, {})
    assert error_of(await r.get_json(), 400, "invalid_request_error") == "'input' is required"


@route("GET /v1/responses/:response_id", "POST /v1/responses")
async def test_retrieve_a_stored_response(serve):
    s = await serve(script=reply("stored"))
    created = await (await s.post("/v1/responses", {"input": "Hello"})).get_json()
    r = await s.get(f"/v1/responses/{created['id']}")
    assert r.status_code == 200 and r.content_type == JSON_TYPE
    assert await r.get_json() == created
    r = await s.get("/v1/responses/resp_nope")
    assert error_of(await r.get_json(), 404, "not_found_error") == (
        "Response with id 'resp_nope' not found.")


@route("POST /v1/responses/:response_id/cancel", "POST /v1/responses")
async def test_cancel_a_background_response(serve):
    s = await serve(script=reply("long answer", hold_after=1))
    res = await (await s.post("/v1/responses", {"input": "Hello", "background": True})).get_json()
    assert res["status"] == "queued" and res["background"] is True
    submit = await s.next_command()   # the generation runs in the app's nursery
    r = await s.post(f"/v1/responses/{res['id']}/cancel", None, raw=b"")
    assert r.status_code == 200 and r.content_type == JSON_TYPE
    cancelled = await r.get_json()
    assert cancelled["status"] == "cancelled" and cancelled["id"] == res["id"]
    assert await s.next_command() == Cancel(submit.job.id)
    fg = await (await s.post("/v1/responses", {"input": "x", "store": False,
                                               "max_output_tokens": 1})).get_json()
    r = await s.post(f"/v1/responses/{fg['id']}/cancel", None, raw=b"")
    assert error_of(await r.get_json(), 404, "not_found_error") == (
        f"Response with id '{fg['id']}' not found.")
    kept = await (await s.post("/v1/responses", {"input": "x", "max_output_tokens": 1})
                  ).get_json()
    r = await s.post(f"/v1/responses/{kept['id']}/cancel", None, raw=b"")
    assert error_of(await r.get_json(), 400, "invalid_request_error") == (
        "Only responses created with background=true can be cancelled.")

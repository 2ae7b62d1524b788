"""POST /v1/responses (and /responses, and the input-token routes) through
the official `openai` SDK.  As on the chat route, nothing depends on what
the random-weight model says: the text equals the native route's greedy
output on the same rendered prompt, the streamed deltas rebuild the final
response, and reasoning / function calls are driven by assistant prefills."""

from __future__ import annotations

import pytest

from .sse import iter_sse_lines, post
from .test_chat_completions import native_text

pytestmark = pytest.mark.e2e

GREEDY = {"max_output_tokens": 12, "temperature": 0, "extra_body": {"ignore_eos": True}}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
CHAT_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def test_response_shape_and_text(server, client):
    res = client.responses.create(model="m", input="Tell me about the engine.",
                                  instructions="Be brief.", **GREEDY)
    generated = native_text(server.url, {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Tell me about the engine."}]})
    assert res.object == "response" and res.status == "completed" and res.id.startswith("resp_")
    assert res.output_text == generated
    (item,) = res.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert res.usage.output_tokens == 12
    n = post(server.url, {"input": "Tell me about the engine.", "instructions": "Be brief."},
             path="/v1/responses/input_tokens").json()
    assert n == {"input_tokens": res.usage.input_tokens, "object": "response.input_tokens"}
    assert post(server.url, {"input": "Tell me about the engine.", "instructions": "Be brief."},
                path="/responses/input_tokens").json() == n


def test_stream_rebuilds_the_response(client):
    whole = client.responses.create(model="m", input="Hello", **GREEDY)
    events = list(client.responses.create(model="m", input="Hello", stream=True, **GREEDY))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    done = [e for e in events if e.type == "response.output_text.done"]
    assert done[0].text == text
    assert events[-1].response.output[0].content[0].text == text


def test_raw_stream_events_are_named(server):
    import httpx
    with httpx.Client(timeout=60) as c, c.stream("POST", server.url + "/responses", json={
            "input": "Hi", "max_output_tokens": 2, "stream": True}) as r:
        lines = [ln for ln in iter_sse_lines(r) if ln]
    names = [ln[7:] for ln in lines if ln.startswith("event: ")]
    assert names[0] == "response.created" and names[-1] == "response.completed"
    assert "data: [DONE]" not in lines


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_item(server, client, stream):
    items = [{"role": "user", "content": "Hi"},
             {"role": "assistant", "type": "message", "content": "<think>\n"}]
    generated = native_text(server.url, {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "<think>\n"}]}]})
    if stream:
        events = list(client.responses.create(model="m", input=items, stream=True, **GREEDY))
        reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
        output = events[-1].response.output
    else:
        res = client.responses.create(model="m", input=items, **GREEDY)
        output = res.output
        reasoning = output[0].content[0].text
    assert [o.type for o in output] == ["reasoning"]
    assert reasoning == generated.strip() == output[0].content[0].text


@pytest.mark.parametrize("stream", [False, True])
def test_function_call_items(client, stream):
    forced = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}'
    items = [{"role": "user", "content": "Weather?"},
             {"role": "assistant", "type": "message", "content": forced}]
    kw = dict(model="m", input=items, tools=TOOLS, **GREEDY)
    if stream:
        events = list(client.responses.create(stream=True, **kw))
        args = "".join(e.delta for e in events
                       if e.type == "response.function_call_arguments.delta")
        output = events[-1].response.output
        assert args == '{"city": "Paris"}'
    else:
        output = client.responses.create(**kw).output
    calls = [o for o in output if o.type == "function_call"]
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Paris"}')]
    assert calls[0].call_id.startswith("call_") and calls[0].id.startswith("fc_")


def test_items_render_like_chat_messages(server):
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
             {"type": "function_call", "call_id": "c1", "name": "get_weather",
              "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]
    n = post(server.url, {"input": items, "tools": TOOLS}, path="/v1/responses/input_tokens")
    chat = post(server.url, {"tools": CHAT_TOOLS, "messages": [
        {"role": "user", "content": [{"text": "Weather?", "type": "text"}]},
        {"role": "assistant", "tool_calls": [{"function": {
            "arguments": '{"city": "Paris"}', "name": "get_weather"}, "id": "c1",
            "type": "function"}]},
        {"content": "sunny", "role": "tool", "tool_call_id": "c1"}]},
        path="/v1/chat/completions/input_tokens")
    assert n.json()["input_tokens"] == chat.json()["input_tokens"]


@pytest.mark.parametrize("body, message", [
    ({}, "'input' is required"),
    ({"input": 5}, "'input' must be a string or array of objects"),
    ({"input": "x", "previous_response_id": "resp_1"},
     "Previous response with id 'resp_1' not found."),
    ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
     "'input_file' is not supported by llamacpp at this moment"),
    ({"input": [{"type": "mystery"}]}, "Cannot determine type of 'item'"),
    ({"input": "x", "tools": {}}, "'tools' must be an array of objects"),
    ({"input": "x", "n": 2}, "'n' must be 1 on this route: a response carries one output"),
])
def test_upstream_refusals(server, body, message):
    r = post(server.url, body, path="/v1/responses")
    assert r.status_code == 400 and r.json()["error"]["message"] == message


def test_structured_output_through_text_format(client):
    res = client.responses.create(model="m", input="Pick one.", temperature=0,
                                  max_output_tokens=20, text={"format": {
                                      "type": "json_schema", "name": "pick",
                                      "schema": {"enum": ["solo"]}}})
    assert res.output_text == '"solo"'

"""The chat surfaces in-process: OpenAI chat completions, /apply-template,
the input-token counts and the realtime control route
(server/surfaces/openai_chat.py, server/sessions/control.py)."""

from __future__ import annotations

import datetime
import json

import pytest

from mlxcel_trio.protocol.records import ForceEnd, Submit

from .conftest import JSON_TYPE, SSE_TYPE, each_route, error_of
from .fake_engine import fail, reply

route = pytest.mark.route
CHAT = ("POST /chat/completions", "POST /v1/chat/completions")
USER = {"role": "user", "content": "Hello"}
CHAT_KEYS = ["choices", "created", "model", "system_fingerprint", "object", "usage", "id",
             "timings"]
CHUNK_KEYS = ["choices", "created", "id", "model", "system_fingerprint", "object"]


@each_route(*CHAT)
async def test_chat_completion_object(serve, path):
    s = await serve(script=reply("<think>pondering</think>Hi there"))
    r = await s.post(path, {"messages": [USER], "max_tokens": 32})
    assert r.status_code == 200 and r.content_type == JSON_TYPE
    res = await r.get_json()
    assert list(res) == CHAT_KEYS and res["object"] == "chat.completion"
    (choice,) = res["choices"]
    assert list(choice) == ["finish_reason", "index", "message"]
    assert choice["finish_reason"] == "stop"
    msg = choice["message"]
    assert msg["role"] == "assistant" and msg["content"] == "Hi there"
    assert msg["reasoning_content"] == "pondering"
    assert set(res["usage"]) >= {"completion_tokens", "prompt_tokens", "total_tokens"}


@each_route(*CHAT)
async def test_chat_stream_framing(serve, path):
    s = await serve(script=reply("Hi there"))
    st = await s.sse(path, {"messages": [USER], "stream": True})
    assert st.status_code == 200 and st.headers["Content-Type"] == SSE_TYPE
    assert st.frames()[-1] == "[DONE]"
    chunks = st.json_frames()
    assert list(chunks[0]) == CHUNK_KEYS
    assert chunks[0]["choices"][0] == {"finish_reason": None, "index": 0,
                                       "delta": {"role": "assistant", "content": None}}
    assert chunks[-1]["choices"][0]["delta"] == {} and "timings" in chunks[-1]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == "Hi there"


@each_route(*CHAT)
@pytest.mark.parametrize("body,message", [
    ({"messages": [{"role": "user"}]}, "All non-assistant messages must contain 'content'"),
    ({"messages": [{"role": "user", "content": 5}]},
     "Expected 'content' to be a string or an array"),
    ({"messages": [USER, {"role": "assistant", "content": "a"},
                   {"role": "assistant", "content": "b"}]},
     "Cannot have 2 or more assistant messages at the end of the list."),
    ({"messages": [USER], "tool_choice": "maybe"}, "Invalid tool_choice: maybe"),
    ({"messages": [{"content": "x"}]},
     "Failed to parse messages: Missing 'role' in message: {\"content\":\"x\"}"),
])
async def test_chat_validation_wording(serve, path, body, message):
    s = await serve()
    r = await s.post(path, {**body, "max_tokens": 1})
    assert error_of(await r.get_json(), 400, "invalid_request_error") == message


@route("POST /v1/chat/completions")
@pytest.mark.parametrize("schema", [123, {"type": 123}, {"type": "hiccup"}])
async def test_response_format_with_an_invalid_schema_is_a_400(serve, schema):
    s = await serve()
    r = await s.post("/v1/chat/completions", {"messages": [USER], "response_format": {
        "type": "json_object", "schema": schema}})
    assert r.status_code == 400, await r.get_json()
    assert (await r.get_json())["error"]["type"] == "invalid_request_error"


@each_route(*CHAT)
async def test_chat_engine_failure(serve, path):
    s = await serve(script=fail("server_error", "engine step failed"))
    r = await s.post(path, {"messages": [USER]})
    assert error_of(await r.get_json(), 500, "server_error") == "engine step failed"
    late = await serve(script=fail("server_error", "engine step failed", after=1))
    st = await late.sse(path, {"messages": [USER], "stream": True})
    assert json.loads(st.frames()[-1]) == {"error": {
        "code": 500, "message": "engine step failed", "type": "server_error"}}


@route("POST /apply-template")
async def test_apply_template(serve):
    s = await serve()
    r = await s.post("/apply-template", {"messages": [USER]})
    assert r.status_code == 200 and r.content_type == JSON_TYPE
    res = await r.get_json()
    assert list(res) == ["prompt"]
    assert "Hello" in res["prompt"] and res["prompt"].startswith("<|im_start|>")
    r = await s.post("/apply-template", {"messages": [{"role": "user"}]})
    assert error_of(await r.get_json(), 400, "invalid_request_error") == (
        "All non-assistant messages must contain 'content'")


@route("POST /apply-template")
async def test_templates_see_todays_date(serve):
    # upstream adds date_string and datetime to every template's context;
    # a request's chat_template_kwargs may replace them
    tpl = "{{ date_string }}|{{ datetime }}|{{ messages[0].content }}"
    s = await serve("--jinja", "--chat-template", tpl)
    today = datetime.date.today()
    res = await (await s.post("/apply-template", {"messages": [USER]})).get_json()
    assert res["prompt"] == f"{today:%d %b %Y}|{today:%b %d %Y}|Hello"
    res = await (await s.post("/apply-template", {
        "messages": [USER], "chat_template_kwargs": {"date_string": "1 Jan 2000"}})).get_json()
    assert res["prompt"].startswith("1 Jan 2000|")


# a DeepSeek-R1 / QwQ-style generation prompt: thinking opens, and closes at once
# unless enable_thinking is true
_R1ISH = ("{{ messages[0].content }}<A><think>\n"
          "{% if not enable_thinking %}</think>{% endif %}")
# a template without thinking markers whose prompt still depends on enable_thinking
_TOGGLE = "{{ messages[0].content }}<A>{% if not enable_thinking %}<NOTHINK>{% endif %}"


@route("POST /apply-template")
@pytest.mark.parametrize(("template", "argv", "end"), [
    (_R1ISH, [], "<A><think>\n"),                      # auto: the template thinks
    (_R1ISH, ["--reasoning", "auto"], "<A><think>\n"),
    (_R1ISH, ["--reasoning", "off"], "<A><think>\n</think>"),
    (_R1ISH, ["--chat-template-kwargs", '{"enable_thinking": false}'], "</think>"),
    (_TOGGLE, [], "<A>"),                               # enable_thinking changes it
    # no thinking: enable_thinking is still defined (false), as upstream passes it always
    ("{{ messages[0].content }}<A>{% if enable_thinking is defined %}D{% endif %}", [], "<A>D"),
])
async def test_reasoning_auto_passes_enable_thinking(serve, template, argv, end):
    s = await serve("--jinja", "--chat-template", template, *argv)
    res = await (await s.post("/apply-template", {"messages": [USER]})).get_json()
    assert res["prompt"].endswith(end) and res["prompt"].startswith("Hello<A>")


@each_route("POST /chat/completions/input_tokens", "POST /v1/chat/completions/input_tokens")
async def test_chat_input_tokens(serve, vocab, path):
    s = await serve()
    prompt = await (await s.post("/apply-template", {"messages": [USER]})).get_json()
    r = await s.post(path, {"messages": [USER]})
    assert r.status_code == 200 and r.content_type == JSON_TYPE
    assert await r.get_json() == {"input_tokens": len(vocab.tokenize(prompt["prompt"])),
                                  "object": "response.input_tokens"}
    r = await s.post(path, {"messages": 5})
    assert error_of(await r.get_json(), 400, "invalid_request_error") == (
        "Expected 'messages' to be an array")


@route("POST /v1/chat/completions/control", "POST /v1/chat/completions")
async def test_control_reaches_a_running_completion(serve):
    s = await serve(script=reply("thinking hard", hold_after=1))
    control = "/v1/chat/completions/control"
    answers = []

    async def end_reasoning(chunks: list[bytes]) -> None:
        cid = json.loads(chunks[0].split(b"\n\n")[0][6:])["id"]
        r = await s.post(control, {"id": cid, "action": "reasoning_end"})
        assert r.content_type == JSON_TYPE
        answers.append(await r.get_json())

    await s.read_then_disconnect("/v1/chat/completions", {
        "messages": [USER], "stream": True, "reasoning_control": True},
        meanwhile=end_reasoning)
    assert answers == [{"success": True}]
    # the control action is a command on the engine's queue, for the request's job
    submit, force_end = await s.next_command(), await s.next_command()
    assert isinstance(submit, Submit) and force_end == ForceEnd((submit.job.id,))
    r = await s.post(control, {"id": "chatcmpl-gone", "action": "reasoning_end"})
    assert await r.get_json() == {"success": False,
                                  "message": "no active completion for this id"}


@route("POST /v1/chat/completions/control")
@pytest.mark.parametrize("body,message", [({}, "missing completion id"),
                                          ({"id": "x", "action": "pause"},
                                           "unknown control action")])
async def test_control_refusals(serve, body, message):
    s = await serve()
    r = await s.post("/v1/chat/completions/control", body)
    assert error_of(await r.get_json(), 400, "invalid_request_error") == message


@route("POST /v1/chat/completions", "POST /v1/completions")
async def test_verbose_servers_add_upstreams_debug_object(serve):
    """-v (upstream: verbosity > 9) makes `verbose` default on: the OpenAI
    shapes carry __verbose, the native object of the same result; a request's
    own `verbose: false` turns it off."""
    s = await serve("-v")
    chat = await (await s.post("/v1/chat/completions", {"messages": [USER]})).get_json()
    assert chat["__verbose"]["content"] == chat["choices"][0]["message"]["content"]
    done = await (await s.post("/v1/completions", {"prompt": "hi", "max_tokens": 3})).get_json()
    assert done["__verbose"]["tokens_predicted"] == done["usage"]["completion_tokens"]
    quiet = await (await s.post("/v1/chat/completions",
                                {"messages": [USER], "verbose": False})).get_json()
    assert "__verbose" not in quiet
    assert list(done)[-2:] == ["__verbose", "timings"]  # upstream's order
    plain = await serve()
    res = await (await plain.post("/v1/chat/completions", {"messages": [USER]})).get_json()
    assert "__verbose" not in res


@route("POST /v1/chat/completions", "POST /v1/completions")
async def test_verbose_servers_stream_the_debug_object_too(serve):
    """Under -v upstream streams __verbose as well: on every /v1/completions
    chunk (the native frame of the same update, before timings) and, for a
    chat, on the first chunk of the final result (the native final object)."""
    s = await serve("-v", script=reply("abc"))
    frames = (await s.sse("/v1/completions", {"prompt": "hi", "stream": True,
                                              "return_progress": True})).json_frames()
    progress, *partials, final = frames
    assert progress["__verbose"]["prompt_progress"] == progress["prompt_progress"]
    assert [f["__verbose"]["content"] for f in partials] == \
        [f["choices"][0]["text"] for f in partials]
    assert list(partials[-1])[-2:] == ["__verbose", "timings"]
    assert final["__verbose"]["stop"] is True and list(final)[-2:] == ["__verbose", "timings"]
    chunks = (await s.sse("/v1/chat/completions", {"messages": [USER], "stream": True,
                                                   "max_tokens": 8})).json_frames()
    verbose = [c for c in chunks if "__verbose" in c]
    assert len(verbose) == 1 and verbose[0]["choices"][0]["finish_reason"] == "stop"
    assert verbose[0]["__verbose"]["stop"] is True
    assert verbose[0]["__verbose"]["tokens_predicted"] == 3
    plain = await serve(script=reply("abc"))
    frames = (await plain.sse("/v1/completions", {"prompt": "hi", "stream": True})).json_frames()
    assert not any("__verbose" in f for f in frames)

"""POST /v1/chat/completions through the official `openai` SDK against a real
server, plus raw httpx for the llama-server-only routes.

The fixture model's weights are random, so nothing here depends on what it
says: greedy chat output must equal the native route's output on the same
rendered prompt, streamed deltas must concatenate to the non-streamed
message, and reasoning / tool-call placement is driven through assistant
prefills (the model continues inside an open <think> block it never closes,
since the fixture's lm_head row for </think> is zero).
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from .sse import post, stream_frames

pytestmark = pytest.mark.e2e

GREEDY = {"temperature": 0, "max_tokens": 12, "extra_body": {"ignore_eos": True}}
# a forced call on the random weights: no reasoning first (it could run past max_tokens)
NOW = {"reasoning_budget_tokens": 0}
USER = {"role": "user", "content": "Tell me about the engine."}
THINK = [USER, {"role": "assistant", "content": "<think>\n"}]
CALL = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def prompt_of(url, body) -> str:
    r = post(url, body, path="/apply-template")
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def native_text(url, body, n=12) -> str:
    """What the model generates greedily after the rendered chat prompt."""
    prompt = prompt_of(url, body)
    ids = post(url, {"content": prompt, "parse_special": True}, path="/tokenize").json()["tokens"]
    r = post(url, {"prompt": ids, "n_predict": n, "temperature": 0, "ignore_eos": True})
    return r.json()["content"]


def stream_chat(client, **kw):
    chunks = list(client.chat.completions.create(stream=True, **kw))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or ""
                        for c in chunks if c.choices)
    return chunks, content, reasoning


def test_non_streaming_shape_and_greedy_text(server, client):
    res = client.chat.completions.create(model="m", messages=[USER], **GREEDY)
    assert res.object == "chat.completion" and res.id.startswith("chatcmpl-")
    assert len(res.id) == len("chatcmpl-") + 32
    (choice,) = res.choices
    assert choice.index == 0 and choice.finish_reason == "length"
    assert choice.message.role == "assistant"
    assert choice.message.content == native_text(server.url, {"messages": [USER]})
    assert res.usage.completion_tokens == 12
    # greedy with EOS ignored, so exactly two tokens are predicted
    raw = post(server.url, {"messages": [USER], "temperature": 0, "ignore_eos": True,
                            "max_tokens": 2},
               path="/v1/chat/completions")
    body = raw.json()
    assert list(body) == ["choices", "created", "model", "system_fingerprint", "object",
                          "usage", "id", "timings"]
    assert list(body["choices"][0]) == ["finish_reason", "index", "message"]
    assert body["timings"]["predicted_n"] == 2


def test_usage_counts_the_rendered_prompt(server, client):
    res = client.chat.completions.create(model="m", messages=[USER], max_tokens=1)
    n = post(server.url, {"messages": [USER]}, path="/v1/chat/completions/input_tokens").json()
    assert n == {"input_tokens": res.usage.prompt_tokens, "object": "response.input_tokens"}
    prompt = prompt_of(server.url, {"messages": [USER]})
    ids = post(server.url, {"content": prompt}, path="/tokenize").json()["tokens"]
    assert res.usage.prompt_tokens == len(ids)
    assert post(server.url, {"messages": [USER]},
                path="/chat/completions/input_tokens").json()["input_tokens"] == len(ids)


def test_streamed_deltas_concatenate_to_the_message(server, client):
    whole = client.chat.completions.create(model="m", messages=[USER], **GREEDY)
    chunks, content, _ = stream_chat(client, model="m", messages=[USER],
                                     stream_options={"include_usage": True}, **GREEDY)
    assert content == whole.choices[0].message.content
    first, *_, finish, usage = chunks
    assert first.choices[0].delta.role == "assistant"
    assert finish.choices[0].finish_reason == "length"
    assert usage.choices == [] and usage.usage.completion_tokens == 12
    assert {c.id for c in chunks} == {first.id} and first.object == "chat.completion.chunk"


def test_stream_frames_raw_shape(server):
    frames, _ = stream_frames(server.url, {"messages": [USER], "max_tokens": 3,
                                           "temperature": 0}, path="/chat/completions")
    assert frames[-1] == "[DONE]"
    assert list(frames[0]) == ["choices", "created", "id", "model", "system_fingerprint",
                               "object"]
    assert frames[0]["choices"][0] == {"finish_reason": None, "index": 0,
                                       "delta": {"role": "assistant", "content": None}}
    assert "timings" in frames[-2] and frames[-2]["choices"][0]["delta"] == {}
    assert "usage" not in frames[-2]


def test_n_choices_and_the_slot_limit(server, client):
    res = client.chat.completions.create(model="m", messages=[USER], n=2, **GREEDY)
    assert [c.index for c in res.choices] == [0, 1]
    assert res.choices[0].message.content == res.choices[1].message.content  # greedy
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=[USER], n=5, max_tokens=1)
    assert info.value.body["message"] == \
        "Field 'n': Value must be between 1 <= value <= 4, but got 5"


def test_stop_strings_end_the_answer(server, client):
    text = native_text(server.url, {"messages": [USER]}, n=12)
    word = text[3:6]
    res = client.chat.completions.create(model="m", messages=[USER], stop=[word], **GREEDY)
    assert res.choices[0].finish_reason == "stop"
    assert res.choices[0].message.content == text[:text.index(word)]


@pytest.mark.parametrize("fmt", ["none", "deepseek", "deepseek-legacy", "auto"])
@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_placement(server, client, fmt, stream):
    generated = native_text(server.url, {"messages": THINK})
    kw = dict(model="m", messages=THINK, **{**GREEDY, "extra_body": {
        "ignore_eos": True, "reasoning_format": fmt}})
    if stream:
        _, content, reasoning = stream_chat(client, **kw)
    else:
        msg = client.chat.completions.create(**kw).choices[0].message
        content, reasoning = msg.content, getattr(msg, "reasoning_content", None) or ""
    if fmt == "none":
        assert (content, reasoning) == (generated, "")
    elif fmt == "deepseek-legacy":
        assert (content, reasoning) == (generated, generated.strip())
    else:
        assert (content, reasoning) == ("", generated.strip())


def test_echo_puts_the_prefill_first(server, client):
    generated = native_text(server.url, {"messages": THINK})
    body = dict(model="m", messages=THINK, **{**GREEDY, "extra_body": {
        "ignore_eos": True, "reasoning_format": "none", "echo": True}})
    assert client.chat.completions.create(**body).choices[0].message.content == \
        "<think>\n" + generated
    assert stream_chat(client, **body)[1] == "<think>\n" + generated


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_are_reported_once(server, client, stream):
    messages = [USER, {"role": "assistant", "content": CALL}]
    kw = dict(model="m", messages=messages, tools=TOOLS,
              **{**GREEDY, "extra_body": {"ignore_eos": True, "echo": True}})
    if stream:
        chunks, content, _ = stream_chat(client, **kw)
        calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        assert calls[0].index == 0 and calls[0].function.name == "get_weather"
        assert len(calls[0].id) == 32 and calls[0].type == "function"
        args = "".join(tc.function.arguments or "" for tc in calls)
        names = [tc.function.name for tc in calls if tc.function.name]
    else:
        msg = client.chat.completions.create(**kw).choices[0].message
        content, args = msg.content, msg.tool_calls[0].function.arguments
        names = [tc.function.name for tc in msg.tool_calls]
    assert names == ["get_weather"] and json.loads(args) == {"city": "Paris"}
    assert "tool_call" not in content and "get_weather" not in content
    # without tools the same text is content
    plain = client.chat.completions.create(**{k: v for k, v in kw.items() if k != "tools"})
    assert plain.choices[0].message.content.startswith(CALL)
    assert not plain.choices[0].message.tool_calls


def test_tool_turns_render_through_the_template(server):
    messages = [USER, {"role": "assistant", "content": None, "tool_calls": [{
        "id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    prompt = prompt_of(server.url, {"messages": messages, "tools": TOOLS})
    assert '"name": "get_weather"' in prompt and "<tool_response>\nsunny\n</tool_response>" in prompt
    assert "<tools>" in prompt


@pytest.mark.parametrize("body, error, status, message", [
    ({"messages": []}, None, 200, None),
    ({"messages": [{"role": "user"}]}, openai.BadRequestError, 400,
     "All non-assistant messages must contain 'content'"),
    ({"messages": [{"role": "user", "content": 5}]}, openai.BadRequestError, 400,
     "Expected 'content' to be a string or an array"),
    ({"messages": [USER, {"role": "assistant", "content": "a"},
                   {"role": "assistant", "content": "b"}]}, openai.BadRequestError, 400,
     "Cannot have 2 or more assistant messages at the end of the list."),
    ({"messages": [USER], "tool_choice": "maybe"}, openai.BadRequestError, 400,
     "Invalid tool_choice: maybe"),
    ({"messages": [{"content": "x"}]}, openai.BadRequestError, 400,
     "Failed to parse messages: Missing 'role' in message: {\"content\":\"x\"}"),
])
def test_malformed_requests_get_upstream_wording(server, body, error, status, message):
    r = post(server.url, {**body, "max_tokens": 1}, path="/v1/chat/completions")
    assert r.status_code == status, r.text
    if message is not None:
        err = r.json()["error"]
        assert (err["code"], err["message"]) == (status, message)
        assert err["type"] == ("invalid_request_error" if status == 400 else "server_error")


def test_apply_template_answers_the_prompt_only(server):
    r = post(server.url, {"messages": [USER]}, path="/apply-template")
    assert r.json() == {"prompt": "<|im_start|>user\nTell me about the engine.<|im_end|>\n"
                                  "<|im_start|>assistant\n"}


@pytest.fixture(scope="module")
def primed_server(tiny_model, start_server, tmp_path_factory):
    """The fixture template, but opening a thinking block in the generation
    prompt (as DeepSeek R1's does), with thoughts left in content by default."""
    src = (tiny_model / "chat_template.jinja").read_text()
    src = src.replace("{{- '<|im_start|>assistant' + nl -}}\n    {%- if enable_thinking",
                      "{{- '<|im_start|>assistant' + nl + '<think>' + nl -}}\n    {%- if "
                      "enable_thinking")
    assert "'<think>' + nl -}}" in src
    f = tmp_path_factory.mktemp("tmpl") / "primed.jinja"
    f.write_text(src)
    srv = start_server(tiny_model, "-np", "2", "-c", "2048", "--chat-template-file", str(f),
                       "--reasoning-format", "none", "--no-prefill-assistant")
    yield srv
    srv.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_primed_thinking_block(primed_server, stream):
    with openai.OpenAI(base_url=primed_server.url + "/v1", api_key="x", max_retries=0) as c:
        generated = native_text(primed_server.url, {"messages": [USER]})
        # under "none", as upstream: the prompt's open marker leads the content
        for fmt, want in (("none", ("<think>\n" + generated, "")),
                          ("deepseek", ("", generated.strip())),
                          ("deepseek-legacy", ("<think>" + generated, generated.strip()))):
            kw = dict(model="m", messages=[USER], **{**GREEDY, "extra_body": {
                "ignore_eos": True, **({} if fmt == "none" else {"reasoning_format": fmt})}})
            if stream:
                _, content, reasoning = stream_chat(c, **kw)
            else:
                msg = c.chat.completions.create(**kw).choices[0].message
                content = msg.content
                reasoning = getattr(msg, "reasoning_content", None) or ""
            assert (content, reasoning) == want, fmt


def test_no_prefill_assistant_answers_the_last_message(primed_server):
    prompt = prompt_of(primed_server.url, {"messages": THINK})
    assert prompt.endswith("<think>\n<|im_end|>\n<|im_start|>assistant\n<think>\n")


def test_skip_chat_parsing_and_server_kwargs(tiny_model, start_server):
    srv = start_server(tiny_model, "-np", "1", "-c", "1024", "--skip-chat-parsing",
                       "--chat-template-kwargs", '{"enable_thinking": false}')
    try:
        prompt = prompt_of(srv.url, {"messages": [USER]})
        assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        # a request's kwargs override the server's key by key
        assert prompt_of(srv.url, {"messages": [USER], "chat_template_kwargs": {
            "enable_thinking": True}}).endswith("<|im_start|>assistant\n")
        generated = native_text(srv.url, {"messages": THINK, "tools": TOOLS})
        assert "<tools>" in prompt_of(srv.url, {"messages": THINK, "tools": TOOLS})
        r = post(srv.url, {"messages": THINK, "tools": TOOLS, "temperature": 0,
                           "max_tokens": 12, "ignore_eos": True}, path="/v1/chat/completions")
        msg = r.json()["choices"][0]["message"]
        assert msg == {"role": "assistant", "content": generated}
    finally:
        srv.stop()


# one server for two independent flags (shared_server): --api-key only
# guards the routes, --reasoning-alias-field only names a message field
KEYED_NO_ALIAS = ("-np", "1", "-c", "512", "--api-key", "k", "--reasoning-alias-field", "none")
KEY = {"Authorization": "Bearer k"}


def test_chat_routes_need_the_key(tiny_model, shared_server):
    srv = shared_server(tiny_model, *KEYED_NO_ALIAS)
    r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": [USER]})
    assert r.status_code == 401
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="k", max_retries=0) as c:
        assert c.chat.completions.create(model="m", messages=[USER], max_tokens=1).choices


@pytest.mark.parametrize("stream", [False, True])
def test_a_prefill_that_opens_a_call_forces_it(client, stream):
    forced = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}'
    kw = dict(model="m", tools=TOOLS, messages=[USER, {"role": "assistant", "content": forced}],
              **GREEDY)
    if stream:
        chunks, content, _ = stream_chat(client, **kw)
        calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        got = [(calls[0].function.name, "".join(tc.function.arguments or "" for tc in calls))]
    else:
        msg = client.chat.completions.create(**kw).choices[0].message
        content = msg.content
        got = [(tc.function.name, tc.function.arguments) for tc in msg.tool_calls]
    assert got == [("get_weather", '{"city": "Paris"}')] and content == ""


def test_logprobs(server, client):
    res = client.chat.completions.create(model="m", messages=[USER], logprobs=True,
                                         top_logprobs=3, **{**GREEDY, "max_tokens": 4})
    content = res.choices[0].logprobs.content
    assert len(content) == 4 and all(len(e.top_logprobs) == 3 for e in content)
    assert "".join(e.token for e in content) == res.choices[0].message.content
    assert all(e.top_logprobs[0].logprob >= e.top_logprobs[-1].logprob for e in content)
    chunks = list(client.chat.completions.create(
        model="m", messages=[USER], logprobs=True, top_logprobs=2, stream=True,
        **{**GREEDY, "max_tokens": 4}))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]


def test_streaming_several_choices(server, client):
    whole = client.chat.completions.create(model="m", messages=[USER], n=2, **GREEDY)
    chunks = list(client.chat.completions.create(model="m", messages=[USER], n=2, stream=True,
                                                 **GREEDY))
    for i in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
        assert "".join(c.delta.content or "" for c in mine) == whole.choices[i].message.content
        assert [c.finish_reason for c in mine if c.finish_reason] == ["length"]


def test_a_prompt_past_the_slot_context_is_refused(server, client):
    long = {"role": "user", "content": "word " * 2000}
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="m", messages=[long], max_tokens=1,
                                           stream=stream)
        assert info.value.body["type"] == "exceed_context_size_error"


def test_props_report_the_template_in_force(server, primed_server):
    props = httpx.get(server.url + "/props").json()
    assert "{%- macro text(content) -%}" in props["chat_template"]
    assert props["chat_template_caps"] == {
        "supports_object_arguments": True, "supports_parallel_tool_calls": True,
        "supports_preserve_reasoning": True, "supports_reasoning_effort": False,
        "supports_string_content": True, "supports_system_role": True,
        "supports_tool_calls": True, "supports_tools": True, "supports_typed_content": True}
    primed = httpx.get(primed_server.url + "/props").json()["chat_template"]
    assert "'<think>' + nl -}}" in primed and primed != props["chat_template"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_named_tool_choice_forces_the_call(client, stream):
    kw = dict(model="m", messages=[USER], tools=TOOLS,
              tool_choice={"type": "function", "function": {"name": "get_weather"}},
              **{**GREEDY, "extra_body": {**GREEDY["extra_body"], **NOW}})
    whole = client.chat.completions.create(**kw).choices[0].message
    assert [tc.function.name for tc in whole.tool_calls] == ["get_weather"]
    assert "tool_call" not in whole.content
    if stream:
        chunks, content, _ = stream_chat(client, **kw)
        calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        assert calls[0].function.name == "get_weather" and content == whole.content
        assert "".join(tc.function.arguments or "" for tc in calls) == \
            whole.tool_calls[0].function.arguments


def test_structured_output(server, client):
    fmt = {"type": "json_schema", "json_schema": {"name": "pick", "schema": {"enum": ["solo"]}}}
    res = client.chat.completions.create(model="m", messages=[USER], response_format=fmt,
                                         temperature=0, max_tokens=20)
    assert json.loads(res.choices[0].message.content) == "solo"
    assert stream_chat(client, model="m", messages=[USER], response_format=fmt,
                       temperature=0, max_tokens=20)[1] == res.choices[0].message.content
    raw = post(server.url, {"messages": [USER], "json_schema": {"enum": ["duo"]},
                            "temperature": 0, "max_tokens": 20}, path="/v1/chat/completions")
    assert json.loads(raw.json()["choices"][0]["message"]["content"]) == "duo"


@pytest.fixture(scope="module")
def budget_server(tiny_model, start_server):
    srv = start_server(tiny_model, "-np", "1", "-c", "1024", "--reasoning-budget", "3",
                       "--reasoning-budget-message", " Enough thinking.")
    yield srv
    srv.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_budget_forces_the_close(budget_server, stream):
    srv = budget_server
    if True:
        with openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0) as c:
            def ask(**extra):
                kw = dict(model="m", messages=THINK, **{**GREEDY, "max_tokens": 20,
                                                        "extra_body": {"ignore_eos": True,
                                                                       **extra}})
                if stream:
                    _, content, reasoning = stream_chat(c, **kw)
                    return content, reasoning
                msg = c.chat.completions.create(**kw).choices[0].message
                return msg.content, getattr(msg, "reasoning_content", None) or ""
            thoughts = native_text(srv.url, {"messages": THINK}, n=3)
            content, reasoning = ask()
            assert reasoning == (thoughts + " Enough thinking.").strip()
            assert content  # the answer goes on after the forced </think>
            # a request's budget and message override the server's
            assert ask(reasoning_budget_tokens=0, reasoning_budget_message="")[1] == ""
            # -1 means the server's budget, as upstream
            assert ask(reasoning_budget_tokens=-1) == (content, reasoning)
            raw = ask(reasoning_format="none")[0]
            assert raw == thoughts + " Enough thinking.</think>" + content_after(raw)


def content_after(raw: str) -> str:
    return raw.split("</think>", 1)[1]


STRICT = [{"type": "function", "function": {
    "name": name, "description": "d",
    "parameters": {"type": "object", "properties": {"city": {"enum": [city]}},
                   "required": ["city"], "additionalProperties": False}}}
    for name, city in (("get_weather", "Paris"), ("get_time", "Oslo"))]
# the same tools saying nothing of additionalProperties: upstream's grammar
# still takes no other key (JSON Schema's own default would take any)
OPEN = [{**t, "function": {**t["function"], "parameters": {
    k: v for k, v in t["function"]["parameters"].items() if k != "additionalProperties"}}}
    for t in STRICT]


@pytest.mark.parametrize("tools", [STRICT, OPEN], ids=["closed", "unsaid"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                  "function": {"name": "get_time"}}])
def test_a_forced_call_follows_the_tools_schema(client, choice, stream, tools):
    """tool_choice required / named: the arguments are constrained to the
    tool's parameters schema and the call closes the answer, as upstream's
    grammar does (a random-weight model could not produce them otherwise)."""
    kw = dict(model="m", messages=[USER], tools=tools, tool_choice=choice, temperature=0,
              max_tokens=60, parallel_tool_calls=False, extra_body=NOW)
    if stream:
        chunks, content, _ = stream_chat(client, **kw)
        calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        name = calls[0].function.name
        arguments = "".join(tc.function.arguments or "" for tc in calls)
        reason = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        res = client.chat.completions.create(**kw).choices[0]
        (call,) = res.message.tool_calls
        name, arguments, reason, content = (call.function.name, call.function.arguments,
                                            res.finish_reason, res.message.content)
    want = {"get_weather": "Paris", "get_time": "Oslo"}
    if isinstance(choice, dict):
        assert name == "get_time"
    assert json.loads(arguments) == {"city": want[name]}
    assert reason == "tool_calls" and not content


def test_reasoning_alias_field(server, tiny_model, shared_server):
    """--reasoning-alias-field (default reasoning) repeats reasoning_content as
    `reasoning`, in the message and in every delta; none leaves upstream's
    field alone."""
    body = {"messages": THINK, "temperature": 0, "max_tokens": 8, "ignore_eos": True}
    msg = post(server.url, body, path="/v1/chat/completions").json()["choices"][0]["message"]
    assert msg["reasoning_content"] and msg["reasoning"] == msg["reasoning_content"]
    frames, _ = stream_frames(server.url, body, path="/v1/chat/completions")
    deltas = [f["choices"][0]["delta"] for f in frames[:-1] if f["choices"]]
    assert all(d.get("reasoning") == d.get("reasoning_content") for d in deltas)
    assert "".join(d.get("reasoning", "") for d in deltas) == msg["reasoning"]
    plain = shared_server(tiny_model, *KEYED_NO_ALIAS)
    msg2 = post(plain.url, body, path="/v1/chat/completions",
                headers=KEY).json()["choices"][0]["message"]
    assert "reasoning" not in msg2 and msg2["reasoning_content"] == msg["reasoning_content"]



def test_required_with_parallel_calls_keeps_every_call_in_schema(client):
    """parallel_tool_calls (upstream's default: the template's capability):
    further calls may follow the first, each one held to its schema."""
    res = client.chat.completions.create(model="m", messages=[USER], tools=STRICT,
                                         tool_choice="required", temperature=0, max_tokens=200,
                                         extra_body=NOW)
    calls = res.choices[0].message.tool_calls
    want = {"get_weather": "Paris", "get_time": "Oslo"}
    assert calls and all(json.loads(c.function.arguments) == {"city": want[c.function.name]}
                         for c in calls)
    assert not res.choices[0].message.content

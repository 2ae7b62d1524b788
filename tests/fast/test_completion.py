"""POST /completion, /completions, /v1/completions and /infill in-process:
response shapes, SSE framing, upstream's validation wording, engine
failures as upstream envelopes, and a disconnect cancelling the job."""

from __future__ import annotations

import json

import pytest

from mlxcel_trio.protocol.records import Cancel, Submit

from .conftest import JSON_TYPE, MODEL_NAME, SSE_TYPE, each_route, error_of
from .fake_engine import fail, reply

route = pytest.mark.route
NATIVE = ("POST /completion", "POST /completions")
FINAL_KEYS = ["index", "content", "tokens", "id_slot", "stop", "model", "tokens_predicted",
              "tokens_evaluated", "generation_settings", "prompt", "has_new_line",
              "truncated", "stop_type", "stopping_word", "tokens_cached", "timings"]
PARTIAL_KEYS = ["index", "content", "tokens", "stop", "id_slot", "tokens_predicted",
                "tokens_evaluated"]
TIMINGS_KEYS = ["cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms",
                "prompt_per_second", "predicted_n", "predicted_ms", "predicted_per_token_ms",
                "predicted_per_second"]
OAI_KEYS = ["choices", "created", "model", "system_fingerprint", "object", "usage", "id",
            "timings"]
PARSE_EMPTY = ("[json.exception.parse_error.101] parse error at line 1, column 1: attempting "
               "to parse an empty input; check that your input string or stream contains "
               "the expected JSON")


# -- valid requests ------------------------------------------------------------------

@each_route(*NATIVE)
async def test_native_final_object(serve, path):
    s = await serve(script=reply("Hello there"))
    r = await s.post(path, {"prompt": "Say hi", "n_predict": 2, "return_tokens": True})
    assert r.status_code == 200 and r.content_type == JSON_TYPE
    res = await r.get_json()
    assert list(res) == FINAL_KEYS and list(res["timings"]) == TIMINGS_KEYS
    assert res["content"] == "Hello there"[:len(res["content"])] and res["stop"] is True
    assert res["stop_type"] == "limit" and res["tokens_predicted"] == 2
    assert len(res["tokens"]) == 2 and res["model"] == MODEL_NAME
    assert res["prompt"] == "Say hi" and res["generation_settings"]["n_predict"] == 2


@each_route(*NATIVE)
async def test_native_several_prompts_answer_an_array(serve, path):
    s = await serve("-np", "2")
    r = await s.post(path, {"prompt": ["a", "b"], "n_predict": 1})
    res = await r.get_json()
    assert isinstance(res, list) and [o["index"] for o in res] == [0, 1]


@each_route(*NATIVE)
async def test_native_stream_framing(serve, path):
    s = await serve(script=reply("abc def"))
    st = await s.sse(path, {"prompt": "x", "stream": True, "return_progress": True})
    assert st.status_code == 200 and st.headers["Content-Type"] == SSE_TYPE
    assert st.body.endswith(b"\n\n") and b"[DONE]" not in st.body   # native: no sentinel
    frames = st.json_frames()
    progress, *partials, final = frames
    assert progress["prompt_progress"]["total"] == 1
    assert all(list(f)[:7] == PARTIAL_KEYS and f["stop"] is False for f in partials)
    assert "timings" in partials[-1] and "timings" not in partials[0]
    assert "".join(f["content"] for f in partials) == "abc def"
    assert list(final) == FINAL_KEYS and final["content"] == "" and final["stop"] is True


@each_route(*NATIVE, "POST /v1/completions", "POST /v1/chat/completions")
async def test_progress_frames_carry_timings_per_token(serve, path):
    # upstream puts the slot's timings on a progress frame when timings_per_token
    # is set (before prompt_progress), and only then
    s = await serve(script=reply("ab"))
    body = {"prompt": "x", "messages": [{"role": "user", "content": "x"}], "stream": True,
            "return_progress": True}
    for per_token in (True, False):
        frames = (await s.sse(path, {**body, "timings_per_token": per_token})).json_frames()
        (progress,) = [f for f in frames if "prompt_progress" in f]
        if not per_token:
            assert "timings" not in progress
            continue
        n = progress["prompt_progress"]["processed"] - progress["prompt_progress"]["cache"]
        assert list(progress)[-2:] == ["timings", "prompt_progress"]
        t = progress["timings"]
        assert (t["prompt_n"], t["prompt_ms"], t["predicted_n"], t["predicted_ms"]) == (
            n, float(n), 0, 0.0)  # the fake engine: 1 ms per prompt token


@each_route(*NATIVE)
async def test_response_fields_projects_only_when_it_names_fields(serve, path):
    s = await serve(script=reply("ok"))
    full = await (await s.post(path, {"prompt": "x", "response_fields": []})).get_json()
    assert list(full) == FINAL_KEYS  # an empty list: the whole object, as upstream
    some = await (await s.post(path, {"prompt": "x", "response_fields": [
        "content", "generation_settings/n_predict", "nope"]})).get_json()
    assert some == {"content": "ok", "generation_settings/n_predict": -1}


@route("POST /v1/completions")
async def test_openai_completion_object(serve):
    s = await serve(script=reply("four words right here"))
    r = await s.post("/v1/completions", {"prompt": "x", "max_tokens": 3})
    assert r.status_code == 200 and r.content_type == JSON_TYPE
    res = await r.get_json()
    assert list(res) == OAI_KEYS and res["object"] == "text_completion"
    (choice,) = res["choices"]
    assert choice["finish_reason"] == "length" and choice["logprobs"] is None
    assert res["usage"]["completion_tokens"] == 3 and res["id"].startswith("cmpl-")


@route("POST /v1/completions")
async def test_openai_completion_stream_ends_with_done(serve):
    s = await serve(script=reply("ok"))
    st = await s.sse("/v1/completions", {"prompt": "x", "stream": True})
    assert st.status_code == 200 and st.headers["Content-Type"] == SSE_TYPE
    assert st.frames()[-1] == "[DONE]" and st.body.endswith(b"data: [DONE]\n\n")
    chunks = st.json_frames()
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and "usage" in chunks[-1]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "ok"


@route("POST /infill")
async def test_infill(serve, vocab):
    s = await serve(script=reply("pass"))
    r = await s.post("/infill", {"input_prefix": "def f():\n    ", "input_suffix": "\n",
                                 "n_predict": 4})
    assert r.status_code == 200
    res = await r.get_json()
    assert list(res) == FINAL_KEYS and res["content"] == "pass"
    (submit,) = [await s.next_command()]
    assert isinstance(submit, Submit)
    fim = vocab.fim
    assert submit.job.prompt[0] == fim["pre"] and submit.job.prompt[-1] == fim["mid"]


# -- validation: upstream's wording ----------------------------------------------------

@each_route(*NATIVE, "POST /v1/completions")
@pytest.mark.parametrize("raw,kind", [(b"5", "number"), (b'"x"', "string"),
                                      (b"null", "null"), (b"[1]", "array")])
async def test_top_level_non_objects(serve, path, raw, kind):
    s = await serve()
    r = await s.post(path, raw=raw)
    assert error_of(await r.get_json(), 400, "invalid_request_error") == (
        f"[json.exception.type_error.306] cannot use value() with {kind}")


@each_route(*NATIVE, "POST /v1/completions", "POST /infill")
async def test_empty_body_is_a_parse_error(serve, path):
    s = await serve()
    r = await s.post(path, raw=b"")
    assert r.content_type == JSON_TYPE
    assert error_of(await r.get_json(), 400, "invalid_request_error") == PARSE_EMPTY


@each_route(*NATIVE, "POST /v1/completions")
@pytest.mark.parametrize("body,message", [
    ({"n_predict": 1}, "[json.exception.out_of_range.403] key 'prompt' not found"),
    ({"prompt": []}, '"prompt" must not be empty'),
    ({"prompt": "x", "n_predict": 3000000000},
     ("Field 'n_predict': Value must be between -1 <= value <= 2147483647, "
      "but got -1294967296")),
    ({"prompt": 5}, ('"prompt" elements must be a string, a list of tokens, a JSON object '
                     'containing a prompt string, or a list of mixed strings & tokens.')),
])
async def test_field_errors(serve, path, body, message):
    s = await serve()
    r = await s.post(path, body)
    assert error_of(await r.get_json(), 400, "invalid_request_error") == message


@route("POST /infill")
async def test_infill_needs_prefix_and_suffix(serve):
    s = await serve()
    r = await s.post("/infill", {"input_suffix": ""})
    assert error_of(await r.get_json(), 400, "invalid_request_error") == (
        '"input_prefix" is required')
    r = await s.post("/infill", {"input_prefix": 1, "input_suffix": ""})
    assert error_of(await r.get_json(), 400, "invalid_request_error") == (
        "[json.exception.type_error.302] type must be string, but is number")


# -- engine failures ----------------------------------------------------------------------

CONTEXT = fail("exceed_context_size_error",
               "request (9000 tokens) exceeds the available context size (1024 tokens), "
               "try increasing it", (("n_prompt_tokens", 9000), ("n_ctx", 1024)))


@each_route(*NATIVE, "POST /v1/completions", "POST /infill")
async def test_an_engine_failure_is_the_upstream_envelope(serve, path):
    s = await serve(script=CONTEXT)
    body = {"prompt": "x", "input_prefix": "a", "input_suffix": "b", "n_predict": 2}
    r = await s.post(path, body)
    assert r.status_code == 400 and r.content_type == JSON_TYPE
    assert await r.get_json() == {"error": {
        "code": 400, "type": "exceed_context_size_error",
        "message": "request (9000 tokens) exceeds the available context size (1024 tokens), "
                   "try increasing it", "n_prompt_tokens": 9000, "n_ctx": 1024}}


@each_route(*NATIVE, "POST /v1/completions")
async def test_an_early_stream_failure_is_an_http_error(serve, path):
    s = await serve(script=fail("server_error", "boom"))
    st = await s.sse(path, {"prompt": "x", "stream": True})
    assert st.status_code == 500
    assert json.loads(st.body) == {"error": {"code": 500, "message": "boom",
                                             "type": "server_error"}}


@each_route(*NATIVE, "POST /v1/completions")
async def test_a_late_stream_failure_is_an_error_frame(serve, path):
    s = await serve(script=fail("server_error", "boom", after=2))
    st = await s.sse(path, {"prompt": "x", "stream": True})
    assert st.status_code == 200
    frames = st.frames()
    assert json.loads(frames[-1]) == {"error": {"code": 500, "message": "boom",
                                                "type": "server_error"}}
    assert "[DONE]" not in frames   # an error ends the stream without the sentinel
    assert len(frames) == 3


# -- cancellation ----------------------------------------------------------------------

@each_route(*NATIVE, "POST /v1/completions")
async def test_a_disconnect_cancels_the_job(serve, path):
    s = await serve(script=reply("one two three", hold_after=1))
    (first,) = await s.read_then_disconnect(path, {"prompt": "x", "stream": True})
    assert first.startswith(b"data: ")
    submit = await s.next_command()
    assert isinstance(submit, Submit)
    assert await s.next_command() == Cancel(submit.job.id)

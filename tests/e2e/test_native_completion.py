"""POST /completion and /completions against a real server: shapes and fields."""

from __future__ import annotations

import pytest

from .sse import complete, post, stream_frames

pytestmark = pytest.mark.e2e

FINAL_KEYS = ["index", "content", "tokens", "id_slot", "stop", "model", "tokens_predicted",
              "tokens_evaluated", "generation_settings", "prompt", "has_new_line", "truncated",
              "stop_type", "stopping_word", "tokens_cached", "timings"]
PARTIAL_KEYS = ["index", "content", "tokens", "stop", "id_slot", "tokens_predicted",
                "tokens_evaluated"]
TIMING_KEYS = ["cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
               "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second"]
GREEDY = {"temperature": 0, "ignore_eos": True}


def test_final_object_key_set_and_order(server, tiny_facts):
    res = complete(server, prompt=tiny_facts["long_prompt"], n_predict=8, **GREEDY)
    assert list(res) == FINAL_KEYS
    assert list(res["timings"]) == TIMING_KEYS
    assert res["stop"] is True and res["tokens"] == []
    assert res["tokens_predicted"] == 8 and res["stop_type"] == "limit"
    assert res["truncated"] is False
    assert res["prompt"] == tiny_facts["long_prompt"]
    assert res["tokens_cached"] == res["tokens_evaluated"] + res["tokens_predicted"] - 1
    # the shared server's prompt cache may supply a prefix other tests left
    assert res["timings"]["prompt_n"] == res["tokens_evaluated"] - res["timings"]["cache_n"]
    assert res["timings"]["predicted_n"] == 8
    gs = res["generation_settings"]
    assert gs["n_predict"] == 8 and gs["temperature"] == 0.0
    assert "backend_sampling" not in gs and gs["speculative.types"] == "none"


def test_completions_alias_route_is_native(server, tiny_facts):
    a = post(server.url, {"prompt": "Hello", "n_predict": 6, **GREEDY}, path="/completions").json()
    b = complete(server, prompt="Hello", n_predict=6, **GREEDY)
    assert list(a) == FINAL_KEYS
    assert a["content"] == b["content"]


def test_greedy_is_deterministic(server, tiny_facts):
    a = complete(server, prompt=tiny_facts["long_prompt"], n_predict=32, **GREEDY)
    b = complete(server, prompt=tiny_facts["long_prompt"], n_predict=32, **GREEDY)
    assert a["content"] == b["content"]
    assert len(set(tiny_facts["long_greedy_ids"][:32])) > 5


def test_return_tokens_reports_sampled_ids(server, tiny_facts):
    res = complete(server, prompt=tiny_facts["long_prompt"], n_predict=16, return_tokens=True,
                   **GREEDY)
    assert res["tokens"] == tiny_facts["long_greedy_ids"][:16]


def test_stream_frames(server, tiny_facts):
    frames, raw = stream_frames(server.url, {"prompt": tiny_facts["long_prompt"],
                                             "n_predict": 12, **GREEDY})
    assert "[DONE]" not in frames
    *partials, final = frames
    for f in partials:
        assert list(f)[:7] == PARTIAL_KEYS
        assert f["id_slot"] == -1 and f["stop"] is False and len(f["tokens"]) == 1
    assert "timings" in partials[-1]  # the last partial frame carries timings
    assert "timings" not in partials[0]
    assert list(final) == FINAL_KEYS
    assert final["content"] == "" and final["tokens"] == [] and final["id_slot"] >= 0
    streamed_ids = [f["tokens"][0] for f in partials]
    assert streamed_ids == tiny_facts["long_greedy_ids"][:len(streamed_ids)]
    non_stream = complete(server, prompt=tiny_facts["long_prompt"], n_predict=12, **GREEDY)
    assert "".join(f["content"] for f in partials) == non_stream["content"]
    assert partials[-1]["tokens_predicted"] == 12


def test_timings_per_token(server):
    frames, _ = stream_frames(server.url, {"prompt": "Hello", "n_predict": 4,
                                           "timings_per_token": True, **GREEDY})
    for f in frames[:-1]:
        assert list(f["timings"]) == TIMING_KEYS
        assert f["timings"]["prompt_n"] > 0


def test_return_progress_frames(server, tiny_facts):
    frames, _ = stream_frames(server.url, {"prompt": tiny_facts["long_prompt"] * 4,
                                           "n_predict": 2, "return_progress": True, **GREEDY})
    progress = [f["prompt_progress"] for f in frames if "prompt_progress" in f]
    assert progress, frames[:3]
    # cache-supplied tokens count as processed (0 on a cold prompt)
    assert progress[0]["processed"] == progress[0]["cache"]
    assert all(set(p) == {"total", "cache", "processed", "time_ms"} for p in progress)
    assert [p["processed"] for p in progress] == sorted(p["processed"] for p in progress)
    assert all(f["content"] == "" for f in frames if "prompt_progress" in f)
    # upstream's shape: a value-initialized token (id 0), whole milliseconds
    assert all(f["tokens"] == [0] for f in frames if "prompt_progress" in f)
    assert all(type(p["time_ms"]) is int for p in progress)
    # inert without stream
    res = complete(server, prompt="Hi", n_predict=2, return_progress=True, **GREEDY)
    assert "prompt_progress" not in res


def test_response_fields_projection(server):
    res = complete(server, prompt="Hi", n_predict=3,
                   response_fields=["content", "generation_settings/n_predict", "nope/x", ""],
                   **GREEDY)
    assert set(res) == {"content", "generation_settings/n_predict"}
    assert res["generation_settings/n_predict"] == 3
    whole = complete(server, prompt="Hi", n_predict=3, response_fields="content", **GREEDY)
    assert list(whole) == FINAL_KEYS
    frames, _ = stream_frames(server.url, {"prompt": "Hi", "n_predict": 3,
                                           "response_fields": ["stop_type"], **GREEDY})
    assert frames[-1] == {"stop_type": "limit"}
    assert "content" in frames[0]


def test_n_predict_zero_yields_one_token(server):
    res = complete(server, prompt="Hello there", n_predict=0, **GREEDY)
    assert res["tokens_predicted"] == 1
    assert res["tokens_cached"] == res["tokens_evaluated"]


@pytest.mark.parametrize("spelling", ["n_predict", "max_tokens", "max_completion_tokens"])
def test_n_predict_domain_uses_the_spelling_sent(server, spelling):
    r = post(server.url, {"prompt": "x", spelling: -2})
    assert r.status_code == 400
    assert r.json() == {"error": {
        "code": 400, "type": "invalid_request_error",
        "message": f"Field '{spelling}': Value must be between -1 <= value <= 2147483647, but got -2"}}


def test_n_cmpl(server, tiny_facts):
    assert complete(server, prompt="x", n_predict=1, n_cmpl=1)["tokens_predicted"] == 1
    for name in ("n_cmpl", "n"):
        res = post(server.url, {"prompt": "x", name: 2, "n_predict": 3, **GREEDY}).json()
        assert [r["index"] for r in res] == [0, 1]
        assert res[0]["content"] == res[1]["content"]  # greedy copies agree
        # upstream's hard limit is the slot count (-np 4 here)
        r = post(server.url, {"prompt": "x", name: 5})
        assert r.status_code == 400
        assert r.json()["error"]["message"] == \
            f"Field '{name}': Value must be between 1 <= value <= 4, but got 5"
    # seeded copies sample with seed + copy, so they differ
    seeded = post(server.url, {"prompt": tiny_facts["long_prompt"], "n_cmpl": 2, "n_predict": 24,
                               "temperature": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
                               "seed": 5, "ignore_eos": True}).json()
    assert seeded[0]["content"] != seeded[1]["content"]
    # prompts x copies, indexed prompt-major
    grid = post(server.url, {"prompt": ["Hello", "World"], "n_cmpl": 2, "n_predict": 3,
                             **GREEDY}).json()
    assert [r["index"] for r in grid] == [0, 1, 2, 3]
    assert grid[0]["content"] == grid[1]["content"] != grid[2]["content"] == grid[3]["content"]


def test_streaming_several_results_interleaves_by_index(server):
    frames, _ = stream_frames(server.url, {"prompt": ["Hello", "World"], "n_predict": 6,
                                           **GREEDY})
    finals = [f for f in frames if f["stop"]]
    assert sorted(f["index"] for f in finals) == [0, 1]
    for i, prompt in enumerate(["Hello", "World"]):
        text = "".join(f["content"] for f in frames if f["index"] == i and not f["stop"])
        assert text == complete(server, prompt=prompt, n_predict=6, **GREEDY)["content"]


def test_verbose_is_inert(server):
    a = complete(server, prompt="x", n_predict=2, verbose=True, **GREEDY)
    b = complete(server, prompt="x", n_predict=2, **GREEDY)
    assert list(a) == list(b) == FINAL_KEYS


def test_stream_options_type_checked(server):
    r = post(server.url, {"prompt": "x", "stream_options": {"include_usage": "yes"}})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == \
        "Field 'include_usage': [json.exception.type_error.302] type must be boolean, but is string"
    assert complete(server, prompt="x", n_predict=1, stream_options=5)["stop"] is True


def test_type_errors_use_upstream_wording(server):
    r = post(server.url, {"prompt": "x", "n_predict": "ten"})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == \
        "Field 'n_predict': [json.exception.type_error.302] type must be number, but is string"
    r = post(server.url, {"prompt": "x", "stream": 1})
    assert r.json()["error"]["message"] == \
        "Field 'stream': [json.exception.type_error.302] type must be boolean, but is number"


def test_prompt_shapes(server, tiny_model):
    import httpx
    ids = httpx.post(server.url + "/tokenize", json={"content": "Hello world"}).json()["tokens"]
    by_text = complete(server, prompt="Hello world", n_predict=5, **GREEDY)
    by_ids = complete(server, prompt=ids, n_predict=5, **GREEDY)
    mixed = complete(server, prompt=["Hello", ids[-1]], n_predict=5, return_tokens=True, **GREEDY)
    obj = complete(server, prompt={"prompt_string": "Hello world"}, n_predict=5, **GREEDY)
    assert by_text["content"] == by_ids["content"] == obj["content"]
    assert by_text["tokens_evaluated"] == len(ids)
    assert mixed["tokens_evaluated"] == len(ids)


def test_multiple_prompts_answer_an_array(server):
    res = post(server.url, {"prompt": ["Hello", "World"], "n_predict": 3, **GREEDY}).json()
    assert isinstance(res, list) and [r["index"] for r in res] == [0, 1]
    solo = complete(server, prompt="World", n_predict=3, **GREEDY)
    assert res[1]["content"] == solo["content"]


@pytest.mark.parametrize("body,status,message", [
    ({}, 400, "[json.exception.out_of_range.403] key 'prompt' not found"),
    ({"prompt": []}, 400, '"prompt" must not be empty'),
    ({"prompt": 5}, 400, '"prompt" elements must be a string, a list of tokens, a JSON object '
                         'containing a prompt string, or a list of mixed strings & tokens.'),
    ({"prompt": [10**7]}, 400, "Prompt contains invalid tokens"),
])
def test_bad_prompts(server, body, status, message):
    r = post(server.url, body)
    assert r.status_code == status
    assert r.json()["error"]["message"] == message


def test_context_overflow_error(server):
    r = post(server.url, {"prompt": [5] * 1100})
    assert r.status_code == 400
    assert r.json() == {"error": {
        "code": 400, "type": "exceed_context_size_error",
        "message": "request (1100 tokens) exceeds the available context size (1024 tokens), "
                   "try increasing it",
        "n_prompt_tokens": 1100, "n_ctx": 1024}}


def test_n_predict_minus_one_stops_at_the_context_bound(server):
    res = complete(server, prompt=[5] * 1000, n_predict=-1, **GREEDY)
    assert res["tokens_predicted"] == 24
    assert res["stop_type"] == "limit" and res["truncated"] is True


def test_eos_stops(server, tiny_facts):
    res = complete(server, prompt=tiny_facts["eos_prompt"], n_predict=64, temperature=0)
    assert res["stop_type"] == "eos"
    # upstream counts the end-of-generation token itself
    assert res["tokens_predicted"] == tiny_facts["eos_after_tokens"] + 1
    assert res["truncated"] is False
    ignored = complete(server, prompt=tiny_facts["eos_prompt"], n_predict=64, return_tokens=True,
                       **GREEDY)
    assert ignored["stop_type"] == "limit" and ignored["tokens_predicted"] == 64
    # upstream bans end-of-generation tokens outright: they are never sampled
    assert not set(ignored["tokens"]) & set(tiny_facts["eos_token_ids"])
    assert ignored["tokens"][:len(tiny_facts["eos_greedy_ids"])] == tiny_facts["eos_greedy_ids"]


def test_seeded_sampling_is_reproducible(server, tiny_facts):
    body = dict(prompt=tiny_facts["long_prompt"], n_predict=24, temperature=1.5, top_k=0,
                top_p=1.0, min_p=0.0, ignore_eos=True)
    a = complete(server, seed=1234, **body)
    b = complete(server, seed=1234, **body)
    c = complete(server, seed=99, **body)
    g = complete(server, **{**body, "temperature": 0})
    assert a["content"] == b["content"]
    assert c["content"] != a["content"] or g["content"] != a["content"]
    assert a["generation_settings"]["seed"] == 1234
    assert complete(server, seed=-2, n_predict=1, prompt="x")["generation_settings"]["seed"] == 4294967294


def test_top_k_one_is_greedy(server, tiny_facts):
    body = dict(prompt=tiny_facts["long_prompt"], n_predict=16, ignore_eos=True)
    a = complete(server, temperature=1.0, top_k=1, seed=7, **body)
    g = complete(server, temperature=0, **body)
    assert a["content"] == g["content"]


def test_stop_string_across_tokens(server, tiny_facts):
    base = complete(server, prompt=tiny_facts["long_prompt"], n_predict=40, return_tokens=True,
                    **GREEDY)
    text = base["content"]
    # pick a stop that straddles a token boundary: the text of tokens 5..6 sliced mid-token
    import httpx
    pieces = [httpx.post(server.url + "/detokenize", json={"tokens": [t]}).json()["content"]
              for t in base["tokens"][:12]]
    start = sum(len(p) for p in pieces[:5])
    stop = text[start + max(0, len(pieces[5]) - 1): start + len(pieces[5]) + 1]
    assert len(stop) >= 2
    expected = text[:text.index(stop)]
    res = complete(server, prompt=tiny_facts["long_prompt"], n_predict=40, stop=[stop], **GREEDY)
    assert res["content"] == expected
    assert res["stop_type"] == "word" and res["stopping_word"] == stop
    frames, _ = stream_frames(server.url, {"prompt": tiny_facts["long_prompt"], "n_predict": 40,
                                           "stop": [stop], **GREEDY})
    assert "".join(f["content"] for f in frames[:-1]) == expected
    assert frames[-1]["stop_type"] == "word"


def test_n_indent_stops_on_a_shallow_line(server, tiny_facts):
    body = dict(prompt=tiny_facts["long_prompt"], n_predict=400, **GREEDY)
    free = complete(server, **body)
    first_nl = free["content"].index("\n")  # the fixture's greedy text has newlines
    res = complete(server, n_indent=1000, **body)
    assert res["stop_type"] == "limit"
    assert res["tokens_predicted"] < free["tokens_predicted"]
    # cut at the first character after the shallow line's leading whitespace
    head, _, last = res["content"].rpartition("\n")
    assert len(head) >= first_nl and last.strip() == ""
    assert free["content"].startswith(res["content"])
    r = post(server.url, {"prompt": "x", "n_indent": -1})
    assert r.json()["error"]["message"] == \
        "Field 'n_indent': Value must be between 0 <= value <= 2147483647, but got -1"


def test_t_max_predict_ms(server, tiny_facts):
    r = post(server.url, {"prompt": "x", "t_max_predict_ms": -2})
    assert r.status_code == 400
    res = complete(server, prompt=tiny_facts["long_prompt"], n_predict=600, t_max_predict_ms=1,
                   **GREEDY)
    assert res["stop_type"] == "limit"
    assert res["tokens_predicted"] < 600
    assert "\n" in res["content"]

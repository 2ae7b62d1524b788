"""POST /v1/completions through the official `openai` SDK against a real server.

The OpenAI route reads the same native field table as /completion, so greedy
text must match the native route token for token; only the envelope differs
(choices / usage / finish_reason, and a `data: [DONE]` trailer when streaming).
"""

from __future__ import annotations

import openai
import pytest

from .sse import post, stream_frames

pytestmark = pytest.mark.e2e

GREEDY = {"temperature": 0, "ignore_eos": True}


def native(server, **body) -> dict:
    r = post(server.url, body)
    assert r.status_code == 200, r.text
    return r.json()


def test_non_streaming_matches_native_greedy(server, client, tiny_facts):
    prompt = tiny_facts["long_prompt"]
    res = client.completions.create(model="anything", prompt=prompt, max_tokens=16,
                                    temperature=0, extra_body={"ignore_eos": True})
    ref = native(server, prompt=prompt, n_predict=16, **GREEDY)
    assert res.object == "text_completion"
    assert res.id.startswith("cmpl-")
    assert res.model == ref["model"]
    assert len(res.choices) == 1
    choice = res.choices[0]
    assert choice.index == 0
    assert choice.text == ref["content"] and choice.text
    assert choice.finish_reason == "length"
    assert res.usage.completion_tokens == 16
    assert res.usage.prompt_tokens == ref["tokens_evaluated"] > 0
    assert res.usage.total_tokens == res.usage.prompt_tokens + 16


def test_usage_counts_the_prompt_tokens(server, client):
    ids = post(server.url, {"content": "Hello world, again"}, path="/tokenize").json()["tokens"]
    res = client.completions.create(model="m", prompt="Hello world, again", max_tokens=3,
                                    temperature=0, extra_body={"ignore_eos": True})
    assert res.usage.prompt_tokens == len(ids) > 2
    # a token-id prompt is counted the same way
    by_ids = client.completions.create(model="m", prompt=ids, max_tokens=3, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert by_ids.usage.prompt_tokens == len(ids)
    assert by_ids.choices[0].text == res.choices[0].text


def test_finish_reason_stop_at_eos(server, client, tiny_facts):
    res = client.completions.create(model="m", prompt=tiny_facts["eos_prompt"], max_tokens=64,
                                    temperature=0)
    ref = native(server, prompt=tiny_facts["eos_prompt"], n_predict=64, temperature=0)
    assert ref["stop_type"] == "eos"
    assert res.choices[0].finish_reason == "stop"
    assert res.choices[0].text == ref["content"]
    # the end-of-generation token is counted, as upstream does
    assert res.usage.completion_tokens == tiny_facts["eos_after_tokens"] + 1 < 64


def test_finish_reason_stop_at_a_stop_word(server, client, tiny_facts):
    prompt = tiny_facts["long_prompt"]
    free = client.completions.create(model="m", prompt=prompt, max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    # a three-character window of plain text, past the first few tokens
    start = next(i for i in range(6, len(free) - 3)
                 if "\ufffd" not in free[i:i + 3] and free[i:i + 3].strip())
    word = free[start:start + 3]
    res = client.completions.create(model="m", prompt=prompt, max_tokens=24, temperature=0,
                                    stop=[word], extra_body={"ignore_eos": True})
    assert res.choices[0].finish_reason == "stop"
    assert res.choices[0].text == free[:free.index(word)]


def test_streaming_through_the_sdk(client, tiny_facts):
    prompt = tiny_facts["long_prompt"]
    whole = client.completions.create(model="m", prompt=prompt, max_tokens=20, temperature=0,
                                      extra_body={"ignore_eos": True})
    chunks = list(client.completions.create(model="m", prompt=prompt, max_tokens=20,
                                            temperature=0, stream=True,
                                            extra_body={"ignore_eos": True}))
    assert len(chunks) > 2
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert all(c.object == "text_completion" for c in chunks)
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("cmpl-")
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 20


def test_streaming_eos_finishes_with_stop(client, tiny_facts):
    chunks = list(client.completions.create(model="m", prompt=tiny_facts["eos_prompt"],
                                            max_tokens=64, temperature=0, stream=True))
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_raw_stream_ends_with_done(server, tiny_facts):
    frames, raw = stream_frames(server.url, {"prompt": tiny_facts["long_prompt"],
                                             "max_tokens": 8, **GREEDY}, path="/v1/completions")
    assert frames[-1] == "[DONE]"
    assert frames.count("[DONE]") == 1
    assert [line for line in raw if line][-1] == "data: [DONE]"
    last = frames[-2]
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["completion_tokens"] == 8
    assert all(f["choices"][0]["finish_reason"] is None for f in frames[:-2])
    text = "".join(f["choices"][0]["text"] for f in frames[:-1])
    ref = native(server, prompt=tiny_facts["long_prompt"], n_predict=8, **GREEDY)
    assert text == ref["content"]


def test_field_errors_reach_the_sdk_as_400(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="m", prompt="x", max_tokens=-2)
    assert info.value.status_code == 400
    assert info.value.body["message"] == \
        "Field 'max_tokens': Value must be between -1 <= value <= 2147483647, but got -2"
    assert info.value.body["type"] == "invalid_request_error"


def test_several_prompts_are_choices_of_one_object(server):
    """upstream folds several results into one object's `choices`."""
    import httpx
    body = {"prompt": ["Hello", "World"], "max_tokens": 4, "temperature": 0,
            "ignore_eos": True}
    res = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    assert [c["index"] for c in res["choices"]] == [0, 1]
    assert res["usage"]["completion_tokens"] == 8
    solo = httpx.post(server.url + "/v1/completions", json={**body, "prompt": "World"},
                      timeout=60).json()
    assert res["choices"][1]["text"] == solo["choices"][0]["text"]


def test_key_order_usage_details_and_verbose(server):
    import httpx
    body = {"prompt": "Hello", "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    res = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    assert list(res) == ["choices", "created", "model", "system_fingerprint", "object", "usage",
                         "id", "timings"]
    assert res["usage"]["prompt_tokens_details"] == {"cached_tokens": res["timings"]["cache_n"]}
    assert "__verbose" not in res
    verbose = httpx.post(server.url + "/v1/completions", json={**body, "verbose": True},
                         timeout=60).json()
    assert verbose["__verbose"]["content"] == verbose["choices"][0]["text"]
    assert verbose["__verbose"]["tokens_predicted"] == 3

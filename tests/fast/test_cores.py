"""The pure server cores, without an app: the native field table
(protocol/fields.py), the sampling handlers (sampler_fields.py),
prompt tokenization (jobs.py) and the native renderers (surfaces/completion.py,
http/sse.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import attrs
import pytest

from mlxcel_trio.config import ServerConfig
from mlxcel_trio.protocol.records import Finished, PromptProgress, Timings
from mlxcel_trio.server.http.errors import ApiError
from mlxcel_trio.server.http.sse import frame
from mlxcel_trio.server.request import sampler_fields
from mlxcel_trio.server.request.schema import TABLE_DEFAULTS, NativeRequest, parse_fields
from mlxcel_trio.server.request.jobs import server_defaults, tokenize_prompts
from mlxcel_trio.server.request.served import Served
from mlxcel_trio.server.request.settings import (
    REDUCED_DROPS,
    generation_settings,
    reduced_settings,
)
from mlxcel_trio.server.surfaces.completion import final_object

from .fake_engine import timings


def _served(vocab) -> Served:
    """What the request cores read of a running server: its vocabulary and
    the server-wide defaults a plain command line gives."""
    defaults = server_defaults(ServerConfig(model="fake"), vocab)
    return Served(SimpleNamespace(vocab=vocab), "m", defaults, "build", state=None)


def _values(body: dict, served: Served) -> NativeRequest:
    return parse_fields(body, served.defaults)


# -- parse_fields --------------------------------------------------------------------------

def test_absent_and_null_fields_take_the_defaults():
    values = parse_fields({"top_k": None}, attrs.evolve(TABLE_DEFAULTS, top_k=20))
    assert values.top_k == 20 and values.n_predict == -1 and values.stop == ()


def test_the_first_present_spelling_wins():
    assert parse_fields({"max_tokens": 5, "n_predict": 7}).n_predict == 7
    assert parse_fields({"max_tokens": 5, "max_completion_tokens": 6}).n_predict == 6


def test_numbers_convert_as_cpp_members_do():
    values = parse_fields({"n_predict": 3.9, "top_k": -5, "temperature": 0.1})
    assert values.n_predict == 3                       # truncated
    assert values.top_k == 0                           # soft limit: clamped
    assert values.temperature == pytest.approx(0.1) and values.temperature != 0.1


@pytest.mark.parametrize("body,message", [
    ({"n_predict": 3000000000}, ("Field 'n_predict': Value must be between -1 <= value <= "
                                 "2147483647, but got -1294967296")),
    ({"max_tokens": 3000000000}, ("Field 'max_tokens': Value must be between -1 <= value <= "
                                  "2147483647, but got -1294967296")),
])
def test_hard_limits_reject_with_the_spelling_used(body, message):
    with pytest.raises(ApiError) as info:
        parse_fields(body)
    assert info.value.message == message and info.value.status == 400


def test_a_server_limit_overrides_the_table():
    assert parse_fields({"n": 2}, limits={"n_cmpl": (1, 4)}).n_cmpl == 2
    with pytest.raises(ApiError):
        parse_fields({"n": 5}, limits={"n_cmpl": (1, 4)})


# -- sampling resolve -------------------------------------------------------------------------

def test_resolve_logit_bias_and_ignore_eos(vocab):
    served = _served(vocab)
    body = {"logit_bias": [[5, 1.5], ["hi", False], [10**9, 2.0]], "ignore_eos": True}
    values = _values(body, served)
    values = sampler_fields.resolve(body, values, served)
    # in request order; false bans; an id past the vocabulary is dropped; then
    # ignore_eos bans every end-of-generation token
    assert values.logit_bias == ((5, 1.5), *((t, -math.inf) for t in vocab.tokenize("hi")),
                                    *((t, -math.inf) for t in sorted(vocab.eos_ids)))


def test_resolve_samplers_and_breakers(vocab):
    served = _served(vocab)
    body = {"samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p",
                         "xtc", "temperature", "adaptive_p"], "dry_sequence_breakers": ["x"]}
    values = _values(body, served)
    values = sampler_fields.resolve(body, values, served)
    assert values.samplers[-1] == "adaptive_p"
    assert values.dry_sequence_breakers == ("x",)
    for bad, message in (
            ({"dry_sequence_breakers": []}, ("Field 'dry_sequence_breakers': Error: "
                                             "dry_sequence_breakers must be a non-empty array "
                                             "of strings")),
            ({"samplers": "kt"}, ("Field 'samplers': sampler order top_k;temperature is not "
                                  "served: mlxcel-trio runs upstream's default order "
                                  "(penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;"
                                  "temperature), optionally with adaptive_p"))):
        with pytest.raises(ApiError) as info:
            sampler_fields.resolve(bad, _values(bad, served), served)
        assert info.value.message == message


def test_check_refuses_a_zero_repeat_penalty():
    with pytest.raises(ApiError) as info:
        sampler_fields.check(parse_fields({"repeat_penalty": 0}))
    assert info.value.message == ("Failed to initialize samplers: penalty_repeat must be "
                                  "finite and greater than 0")


# -- tokenize_prompts --------------------------------------------------------------------------

def test_prompt_shapes(vocab):
    hi = vocab.tokenize("hi")
    assert tokenize_prompts({"prompt": "hi"}, vocab) == [hi]
    assert tokenize_prompts({"prompt": [1, 2]}, vocab) == [[1, 2]]
    assert tokenize_prompts({"prompt": ["hi", 3]}, vocab) == [hi + [3]]   # mixed: one prompt
    assert tokenize_prompts({"prompt": ["hi", "hi"]}, vocab) == [hi, hi]  # strings: several
    assert tokenize_prompts({"prompt": {"prompt_string": "hi"}}, vocab) == [hi]
    assert tokenize_prompts({"prompt": [[1], "hi"]}, vocab) == [[1], hi]


@pytest.mark.parametrize("body,message", [
    ({}, "[json.exception.out_of_range.403] key 'prompt' not found"),
    ({"prompt": []}, '"prompt" must not be empty'),
    ({"prompt": None}, ('"prompt" elements must be a string, a list of tokens, a JSON object '
                        'containing a prompt string, or a list of mixed strings & tokens.')),
    ({"prompt": {"prompt_string": "x", "multimodal_data": ["a"]}},
     "Multimodal data provided, but model does not support multimodal requests."),
])
def test_prompt_refusals(vocab, body, message):
    with pytest.raises(ApiError) as info:
        tokenize_prompts(body, vocab)
    assert info.value.message == message


# -- renderers ---------------------------------------------------------------------------------

def test_reduced_settings_drop_upstreams_keys(vocab):
    values = _values({}, _served(vocab))
    full, reduced = generation_settings(values), reduced_settings(values)
    assert list(reduced) == [k for k in full if k not in REDUCED_DROPS]


def test_final_object_streamed_and_not(vocab):
    values = _values({"return_tokens": True}, _served(vocab))
    fin = Finished(7, 0, "Hi\n", (5, 6), "eos", "", False, 3, timings(3, 2))
    whole = final_object(_served(vocab), values, fin, [1, 2, 3], 0, streamed=False)
    assert whole["content"] == "Hi\n" and whole["tokens"] == [5, 6]
    assert whole["has_new_line"] is True and whole["tokens_cached"] == 4
    assert whole["prompt"] == vocab.detokenize([1, 2, 3])
    streamed = final_object(_served(vocab), values, fin, [1, 2, 3], 0, streamed=True)
    assert streamed["content"] == "" and streamed["tokens"] == []


def test_timings_and_frames():
    t = timings(4, 2).to_json()
    assert t["prompt_per_token_ms"] == 1.0 and t["prompt_per_second"] == 1000.0
    # two tokens in 4 ms are one decode step: the first came from the prompt batch
    assert t["predicted_per_token_ms"] == 4.0 and t["predicted_per_second"] == 250.0
    # a progress update before any prompt batch ran has no prompt time yet
    assert PromptProgress(1, 10, 4, 4, 3.0).timings().to_json()["prompt_ms"] == 0.0
    assert PromptProgress(1, 10, 4, 9, 3.0).timings() == Timings(4, 5, 3.0, 0, 0.0)
    one = timings(3, 1).to_json()
    assert one["predicted_per_token_ms"] == 0.0 and one["predicted_per_second"] == 0.0
    assert timings(0, 0).to_json()["prompt_per_second"] == 0.0
    assert frame({"a": "é", "b": float("nan")}) == 'data: {"a":"é","b":null}\n\n'.encode()
    assert ApiError("x", "exceed_context_size_error", {"n_ctx": 4}).body() == {
        "error": {"code": 400, "message": "x", "type": "exceed_context_size_error",
                  "n_ctx": 4}}

"""The engine's coded failures and the server's sentences for them
(protocol/records.py FAILURE_CODES, server/http/errors.py ENGINE_FAILURES)."""

from __future__ import annotations

import pytest

from mlxcel_trio.protocol.records import FAILURE_CODES, Failed
from mlxcel_trio.server.http.errors import ENGINE_FAILURES, ApiError


def test_every_code_has_one_sentence():
    assert set(ENGINE_FAILURES) == FAILURE_CODES


def test_a_coded_failure_answers_in_the_servers_words():
    err = ApiError.from_failed(Failed.coded(7, "invalid_slot"))
    assert (err.status, err.body()) == (400, {"error": {
        "code": 400, "message": "Invalid slot ID", "type": "invalid_request_error"}})


def test_the_numbers_fill_the_sentence_and_follow_it_in_the_body():
    err = ApiError.from_failed(Failed.exceeds_context(1, 9000, 1024))
    assert err.body() == {"error": {
        "code": 400, "message": "request (9000 tokens) exceeds the available context size "
                                "(1024 tokens), try increasing it",
        "type": "exceed_context_size_error", "n_prompt_tokens": 9000, "n_ctx": 1024}}


def test_an_unknown_code_is_refused_where_the_engine_builds_it():
    with pytest.raises(ValueError, match="unknown failure code"):
        Failed.coded(1, "no_such_failure")


def test_an_uncoded_failure_keeps_its_own_words():
    err = ApiError.from_failed(Failed(3, "server_error", "boom"))
    assert (err.status, err.message, err.type) == (500, "boom", "server_error")


def test_words_fill_the_sentence_and_stay_out_of_the_body():
    err = ApiError.from_failed(Failed.coded(2, "slot_busy", {"slot": 3}))
    assert (err.status, err.body()) == (503, {"error": {
        "code": 503, "message": "slot 3 is processing a task; retry when it is idle",
        "type": "unavailable_error"}})


def test_the_embedders_limits_keep_upstreams_words_and_numbers():
    batch = ApiError.from_failed(Failed.coded(4, "exceeds_batch", {"n_tokens": 9, "n_batch": 8}))
    assert (batch.status, batch.message, batch.extra) == (
        500, "input (9 tokens) is too large to process. increase the physical batch size "
             "(current batch size: 8)", {})
    ctx = ApiError.from_failed(Failed.coded(5, "embed_exceeds_context", n_prompt_tokens=600,
                                            n_ctx=512))
    assert ctx.body() == {"error": {
        "code": 400, "message": "input (600 tokens) is larger than the max context size "
                                "(512 tokens). skipping",
        "type": "exceed_context_size_error", "n_prompt_tokens": 600, "n_ctx": 512}}

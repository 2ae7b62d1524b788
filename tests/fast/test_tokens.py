"""POST /tokenize and /detokenize in-process (server/surfaces/tokens.py)."""

from __future__ import annotations

import pytest

from .conftest import JSON_TYPE, error_of

route = pytest.mark.route


@route("POST /tokenize")
async def test_tokenize(serve, vocab):
    s = await serve()
    r = await s.post("/tokenize", {"content": "Hello world"})
    assert r.status_code == 200 and r.content_type == JSON_TYPE
    assert await r.get_json() == {"tokens": vocab.tokenize("Hello world")}
    r = await s.post("/tokenize", {"content": ["Hi", 5], "with_pieces": True})
    pieces = (await r.get_json())["tokens"]
    assert set(pieces[0]) == {"id", "piece"} and pieces[-1]["id"] == 5
    assert await (await s.post("/tokenize", {})).get_json() == {"tokens": []}


@route("POST /detokenize")
async def test_detokenize(serve, vocab):
    s = await serve()
    ids = vocab.tokenize("round trip")
    r = await s.post("/detokenize", {"tokens": ids})
    assert r.status_code == 200 and r.content_type == JSON_TYPE
    assert await r.get_json() == {"content": "round trip"}
    assert await (await s.post("/detokenize", {})).get_json() == {"content": ""}


@pytest.mark.parametrize("path,body,message", [
    pytest.param("/tokenize", {"content": 5}, "type must be string, but is number",
                 marks=route("POST /tokenize")),
    pytest.param("/tokenize", {"content": ["a", None]}, "type must be number, but is null",
                 marks=route("POST /tokenize")),
    pytest.param("/detokenize", {"tokens": "abc"}, "type must be array, but is string",
                 marks=route("POST /detokenize")),
    pytest.param("/detokenize", {"tokens": [1, "x"]}, "type must be number, but is string",
                 marks=route("POST /detokenize")),
])
async def test_wrong_types_are_upstream_type_errors(serve, path, body, message):
    s = await serve()
    r = await s.post(path, body)
    assert error_of(await r.get_json(), 400, "invalid_request_error") == (
        f"[json.exception.type_error.302] {message}")

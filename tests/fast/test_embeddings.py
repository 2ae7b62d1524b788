"""The embedding and rerank routes on a scripted engine: upstream's shapes,
which field goes where in the jobs, and upstream's wording for bad input
(the numbers themselves are tests/e2e/test_embeddings.py's)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from mlxcel_trio.protocol.records import EmbedJob

from .conftest import JSON_TYPE, each_route, error_of

route = pytest.mark.route
EMBED_ROUTES = ("POST /embedding", "POST /embeddings", "POST /v1/embeddings")
RERANK_ROUTES = ("POST /rerank", "POST /reranking", "POST /v1/rerank", "POST /v1/reranking")


@each_route("POST /embedding", "POST /embeddings")
async def test_native_shape_is_a_bare_array_of_vector_arrays(serve, vocab, path):
    s = await serve("--embeddings")
    r = await s.post(path, {"input": ["hello", "a b c"]})
    assert r.status_code == 200 and r.content_type == JSON_TYPE
    body = await r.get_json()
    assert [list(e) for e in body] == [["index", "embedding"]] * 2
    for i, text in enumerate(["hello", "a b c"]):
        ids = vocab.tokenize(text, True)
        assert body[i] == {"index": i, "embedding": [[len(ids), ids[0], 2]]}


@route("POST /v1/embeddings")
async def test_openai_shape_usage_and_model(serve, vocab):
    s = await serve("--embeddings", "--embd-normalize", "3")
    r = await s.post("/v1/embeddings", {"input": "hello", "model": "mine"})
    body = await r.get_json()
    assert list(body) == ["model", "object", "usage", "data"]
    n = len(vocab.tokenize("hello", True))
    assert body["model"] == "mine" and body["object"] == "list"
    assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}
    # the server's --embd-normalize reaches the job
    assert body["data"] == [{"embedding": [n, vocab.tokenize("hello", True)[0], 3],
                             "index": 0, "object": "embedding"}]
    r = await s.post("/v1/embeddings", {"input": "hello", "encoding_format": "base64",
                                        "embd_normalize": -1})
    item = (await r.get_json())["data"][0]
    assert list(item) == ["embedding", "index", "object", "encoding_format"]
    vec = np.frombuffer(base64.b64decode(item["embedding"]), "<f4")
    assert vec.tolist()[2] == -1 and item["encoding_format"] == "base64"
    # content asks for the native shape
    assert isinstance(await (await s.post("/v1/embeddings", {"content": "x"})).get_json(), list)


@route("POST /v1/embeddings")
async def test_one_job_per_input_carrying_pooling_and_normalize(serve):
    s = await serve("--embeddings", "--pooling", "cls")
    await s.post("/v1/embeddings", {"input": ["a", [5, 6, 7], ["b", 9]],
                                    "embd_normalize": 1})
    jobs = []
    while len(jobs) < 3:
        cmd = await _command(s)
        if isinstance(getattr(cmd, "job", None), EmbedJob):
            jobs.append(cmd.job)
    assert [j.pooling for j in jobs] == ["cls"] * 3 and [j.normalize for j in jobs] == [1] * 3
    assert jobs[1].tokens == (5, 6, 7) and jobs[2].tokens[-1] == 9


async def _command(s):
    import trio
    return await trio.to_thread.run_sync(s.engine.next_command)


@each_route(*EMBED_ROUTES)
@pytest.mark.parametrize("body,message", [
    ({}, '"input" or "content" must be provided'),
    ([1, 2], '"input" or "content" must be provided'),
    ({"input": []}, '"prompt" must not be empty'),
    ({"input": {"x": 1}}, '"prompt" elements must be a string, a list of tokens, a JSON object '
                          'containing a prompt string, or a list of mixed strings & tokens.'),
    ({"input": [[1, 99999]]}, "Prompt contains invalid tokens"),
    ({"input": "x", "encoding_format": "hex"},
     "The format to return the embeddings in. Can be either float or base64"),
    ({"input": "x", "encoding_format": 5},
     "[json.exception.type_error.302] type must be string, but is number"),
    ({"input": "x", "embd_normalize": "2"},
     "[json.exception.type_error.302] type must be number, but is string"),
])
async def test_bad_embedding_input(serve, path, body, message):
    s = await serve("--embeddings")
    r = await s.post(path, body)
    assert error_of(await r.get_json(), 400, "invalid_request_error") == message


@route("POST /v1/embeddings", "POST /embedding")
async def test_pooling_none_is_native_only(serve, vocab):
    s = await serve("--embeddings", "--pooling", "none")
    r = await s.post("/v1/embeddings", {"input": "x"})
    assert error_of(await r.get_json(), 400, "invalid_request_error") == (
        "Pooling type 'none' is not OAI compatible. Please use a different pooling type")
    body = await (await s.post("/embedding", {"content": "a b"})).get_json()
    ids = vocab.tokenize("a b", True)
    assert body[0]["embedding"] == [[i, t, 0] for i, t in enumerate(ids)]


@each_route(*RERANK_ROUTES)
async def test_rerank_jina_envelope_sorted_and_cut(serve, vocab, path):
    s = await serve("--reranking")
    docs = ["aaa", "b", "a much longer document"]
    r = await s.post(path, {"query": "q", "documents": docs, "top_n": 2})
    body = await r.get_json()
    assert list(body) == ["model", "object", "usage", "results"]
    scores = [sum(vocab.tokenize_pair("q", d)[0]) / 1000.0 for d in docs]
    order = sorted(range(3), key=lambda i: -scores[i])[:2]
    assert [e["index"] for e in body["results"]] == order
    assert [list(e) for e in body["results"]] == [["index", "relevance_score"]] * 2
    n = sum(len(vocab.tokenize_pair("q", d)[0]) for d in docs)
    assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}


@route("POST /rerank")
async def test_rerank_tei_shape_and_return_text(serve):
    s = await serve("--reranking")
    body = await (await s.post("/rerank", {"query": "q", "texts": ["x", "yy"],
                                           "return_text": True})).get_json()
    assert isinstance(body, list)
    assert sorted(e["text"] for e in body) == ["x", "yy"]
    assert all(list(e) == ["index", "score", "text"] for e in body)
    # both spellings: the Jina envelope, and documents wins
    body = await (await s.post("/rerank", {"query": "q", "texts": ["x"],
                                           "documents": ["a", "b"]})).get_json()
    assert isinstance(body, list) and len(body) == 2


@each_route(*RERANK_ROUTES)
@pytest.mark.parametrize("body,message", [
    ({"documents": ["a"]}, '"query" must be provided'),
    ([], '"query" must be provided'),
    ({"query": ["q"], "documents": ["a"]}, '"query" must be a string'),
    ({"query": "q"}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": "a"}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": [1]}, '"documents" must be a non-empty string array'),
])
async def test_bad_rerank_input(serve, path, body, message):
    s = await serve("--reranking")
    r = await s.post(path, body)
    assert error_of(await r.get_json(), 400, "invalid_request_error") == message


@each_route(*EMBED_ROUTES)
async def test_a_reranking_server_does_not_embed(serve, path):
    s = await serve("--reranking")
    r = await s.post(path, raw=b"{not json")
    assert error_of(await r.get_json(), 501, "not_supported_error") == (
        "This server does not support embeddings. Start it with `--embeddings`")


@each_route("POST /completion", "POST /completions", "POST /v1/completions", "POST /infill",
            "POST /chat/completions", "POST /v1/chat/completions", "POST /v1/messages",
            "POST /v1/responses", "POST /responses")
async def test_generation_routes_answer_501_in_the_encoder_modes(serve, path):
    for flag in ("--embeddings", "--reranking"):
        s = await serve(flag)
        r = await s.post(path, {"prompt": "x"})
        assert error_of(await r.get_json(), 501, "not_supported_error") == (
            f"This server does not support completions. Start it without `{flag}`")


@route("GET /v1/models", "GET /health")
async def test_models_capabilities_and_health(serve):
    for argv, caps in ((("--embeddings",), ["embedding"]), (("--reranking",), ["rerank"]),
                       ((), ["completion"])):
        s = await serve(*argv)
        body = await (await s.get("/v1/models")).get_json()
        assert body["models"][0]["capabilities"] == caps
        assert (await (await s.get("/health")).get_json()) == {"status": "ok"}


@route("GET /metrics", "POST /v1/embeddings", "POST /rerank")
async def test_metrics_count_embedding_work(serve, vocab):
    s = await serve("--embeddings", "--metrics")
    await s.post("/v1/embeddings", {"input": ["a b", "c"]})
    text = (await (await s.get("/metrics")).get_data()).decode()
    n = len(vocab.tokenize("a b", True)) + len(vocab.tokenize("c", True))
    assert "mlxcel_embedding_inputs_total 2.0" in text
    assert f"mlxcel_embedding_tokens_total {float(n)}" in text
    s = await serve("--reranking", "--metrics")
    await s.post("/rerank", {"query": "q", "documents": ["x", "y", "z"]})
    text = (await (await s.get("/metrics")).get_data()).decode()
    assert "mlxcel_embedding_inputs_total 3.0" in text

"""Embeddings and reranking on real servers over the tiny encoder fixtures:
each answer equals the encoder run here (hidden states pooled and normalized
in NumPy in this file, rerank scores the classifier's logits), batched
equals single, upstream's shapes, the official OpenAI SDK, and upstream's
wording for bad input (and a hypothesis storm of malformed bodies: never a
5xx, the server unaffected)."""

from __future__ import annotations

import base64
import json
import math

import httpx
import mlx.core as mx
import numpy as np
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from mlxcel_trio.engine.encoders import load
from tests.unit.engine._decoder_reranker import qwen3_reranker

pytestmark = pytest.mark.e2e

TEXTS = ["The cat jumps over the fence.", "a",
         "Our team builds seven stones near the harbour while the kettle boils; café, 你好!"]
QUERY = "where does the old sailor go?"
DOCS = ["The old sailor visits the harbour every single day.", "Three apples",
        "def price(node): return node.left + node.right", "the sailor goes home"]


def _fixture(kind: str):
    from fixtures.build import ensure
    return ensure(kind)


def _error(r: httpx.Response, status: int, type_: str) -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == type_ and err["code"] == status
    return err["message"]


# -- references, computed here --------------------------------------------------------

class Ref:
    def __init__(self, kind: str) -> None:
        self.path = _fixture(kind)
        self.model, self.info = load(self.path)
        self.tok = Tokenizer.from_file(str(self.path / "tokenizer.json"))

    def hidden(self, ids: list[int]) -> np.ndarray:
        a = mx.array([ids], mx.int32)
        return np.array(self.model(a, mx.ones_like(a), mx.zeros_like(a)))[0]

    def pooled(self, text, pooling: str) -> np.ndarray:
        ids = text if isinstance(text, list) else self.tok.encode(text).ids
        h = self.hidden(ids).astype(np.float64)
        vec = h.mean(axis=0) if pooling == "mean" else h[0] if pooling == "cls" else h[-1]
        return np.array(self.model.project(mx.array(vec[None].astype(np.float32))))[0]

    def score(self, query: str, doc: str) -> float:
        enc = self.tok.encode(query, doc)
        a = mx.array([enc.ids], mx.int32)
        return float(np.array(self.model.classify(a, mx.ones_like(a),
                                                  mx.array([enc.type_ids], mx.int32)))[0, 0])


def normalized(vec: np.ndarray, kind: int) -> np.ndarray:
    v = vec.astype(np.float64)
    if kind == -1:
        s = 1.0
    elif kind == 0:
        s = np.abs(v).max() / 32760.0
    elif kind == 2:
        s = math.sqrt((v * v).sum())
    else:
        s = (np.abs(v) ** kind).sum() ** (1.0 / kind)
    return v / s if s > 0 else v * 0


@pytest.fixture(scope="module")
def bert():
    return Ref("tiny-bert")


@pytest.fixture(scope="module")
def bert_server(bert, start_server):
    return start_server(bert.path, "--embeddings", "--no-warmup")


@pytest.fixture(scope="module")
def xlmr_server(start_server):
    ref = Ref("tiny-xlmr")
    return ref, start_server(ref.path, "--embedding", "--no-warmup", "-ub", "64")


@pytest.fixture(scope="module", params=["tiny-bert-reranker", "tiny-xlmr-reranker"])
def reranker(request, start_server):
    ref = Ref(request.param)
    return ref, start_server(ref.path, "--reranking", "--no-warmup")


# -- embeddings ----------------------------------------------------------------------------

def test_native_embedding_is_the_mean_pooled_normalized_encoder_output(bert_server, bert):
    r = httpx.post(bert_server.url + "/embedding", json={"content": TEXTS})
    assert r.status_code == 200
    body = r.json()
    assert [e["index"] for e in body] == [0, 1, 2] and all(list(e) == ["index", "embedding"]
                                                           for e in body)
    for text, e in zip(TEXTS, body):
        assert len(e["embedding"]) == 1  # one pooled vector per input, in an array
        np.testing.assert_allclose(e["embedding"][0], normalized(bert.pooled(text, "mean"), 2),
                                   atol=1e-4)


def test_embeddings_path_is_native_and_v1_is_openai(bert_server, bert):
    native = httpx.post(bert_server.url + "/embeddings", json={"input": "hello"}).json()
    assert isinstance(native, list) and list(native[0]) == ["index", "embedding"]
    oai = httpx.post(bert_server.url + "/v1/embeddings", json={"input": "hello"}).json()
    assert list(oai) == ["model", "object", "usage", "data"]
    assert oai["object"] == "list" and oai["data"][0]["object"] == "embedding"
    n = len(bert.tok.encode("hello").ids)
    assert oai["usage"] == {"prompt_tokens": n, "total_tokens": n}
    np.testing.assert_allclose(oai["data"][0]["embedding"], native[0]["embedding"][0], atol=1e-6)
    # "content" asks for the native shape even on /v1/embeddings
    assert isinstance(httpx.post(bert_server.url + "/v1/embeddings",
                                 json={"content": "hello"}).json(), list)


def test_batched_equals_single(bert_server):
    many = httpx.post(bert_server.url + "/v1/embeddings", json={"input": TEXTS}).json()["data"]
    for i, text in enumerate(TEXTS):
        one = httpx.post(bert_server.url + "/v1/embeddings", json={"input": text}).json()
        np.testing.assert_allclose(many[i]["embedding"], one["data"][0]["embedding"], atol=1e-5)
        assert many[i]["index"] == i


def test_token_arrays_and_mixed_inputs(bert_server, bert):
    ids = bert.tok.encode(TEXTS[0]).ids
    r = httpx.post(bert_server.url + "/v1/embeddings", json={"input": [ids, TEXTS[1]]})
    data = r.json()["data"]
    np.testing.assert_allclose(data[0]["embedding"], normalized(bert.pooled(ids, "mean"), 2),
                               atol=1e-4)
    np.testing.assert_allclose(data[1]["embedding"],
                               normalized(bert.pooled(TEXTS[1], "mean"), 2), atol=1e-4)


@pytest.mark.parametrize("kind", [-1, 0, 1, 2, 3])
def test_embd_normalize_has_upstreams_arithmetic(bert_server, bert, kind):
    r = httpx.post(bert_server.url + "/embedding",
                   json={"content": TEXTS[2], "embd_normalize": kind})
    np.testing.assert_allclose(r.json()[0]["embedding"][0],
                               normalized(bert.pooled(TEXTS[2], "mean"), kind),
                               rtol=1e-4, atol=1e-4 * (32760 if kind == 0 else 1))


def test_openai_sdk_float_and_base64(bert_server, bert):
    with openai.OpenAI(base_url=bert_server.url + "/v1", api_key="x", max_retries=0) as client:
        res = client.embeddings.create(model="m", input=TEXTS, encoding_format="float")
        assert res.model == "m" and [d.index for d in res.data] == [0, 1, 2]
        for text, d in zip(TEXTS, res.data):
            np.testing.assert_allclose(d.embedding, normalized(bert.pooled(text, "mean"), 2),
                                       atol=1e-4)
        raw = client.embeddings.create(model="m", input=TEXTS[0], encoding_format="base64")
        vec = np.frombuffer(base64.b64decode(raw.data[0].embedding), "<f4")
        np.testing.assert_allclose(vec, res.data[0].embedding, atol=0)
        # without encoding_format the SDK asks for base64 and decodes it itself
        auto = client.embeddings.create(model="m", input=TEXTS[0])
        np.testing.assert_allclose(auto.data[0].embedding, res.data[0].embedding, atol=0)


def test_cls_pooling_and_dense_head(xlmr_server):
    ref, srv = xlmr_server
    data = httpx.post(srv.url + "/v1/embeddings", json={"input": TEXTS}).json()["data"]
    for text, d in zip(TEXTS, data):
        assert len(d["embedding"]) == ref.info.embedding_size == 32
        np.testing.assert_allclose(d["embedding"], normalized(ref.pooled(text, "cls"), 2),
                                   atol=1e-4)


def test_input_longer_than_the_physical_batch_is_refused(xlmr_server):
    _, srv = xlmr_server
    r = httpx.post(srv.url + "/v1/embeddings", json={"input": "word " * 100})
    msg = _error(r, 500, "server_error")
    assert msg.startswith("input (") and msg.endswith(
        "tokens) is too large to process. increase the physical batch size "
        "(current batch size: 64)")
    assert httpx.post(srv.url + "/v1/embeddings", json={"input": "ok"}).status_code == 200


@pytest.mark.parametrize("body,message", [
    ({}, '"input" or "content" must be provided'),
    ({"input": []}, '"prompt" must not be empty'),
    ({"input": [[5, 100000]]}, "Prompt contains invalid tokens"),
    ({"input": [[-1]]}, "Prompt contains invalid tokens"),
    ({"input": 5}, '"prompt" elements must be a string, a list of tokens, a JSON object '
                   'containing a prompt string, or a list of mixed strings & tokens.'),
    ({"input": "x", "encoding_format": "hex"},
     "The format to return the embeddings in. Can be either float or base64"),
])
def test_bad_embedding_input_gets_upstreams_400(bert_server, body, message):
    r = httpx.post(bert_server.url + "/v1/embeddings", json=body)
    assert _error(r, 400, "invalid_request_error") == message
    assert httpx.get(bert_server.url + "/health").json() == {"status": "ok"}


@pytest.mark.parametrize("path", ["/completion", "/v1/completions", "/v1/chat/completions",
                                  "/infill", "/v1/messages", "/v1/responses"])
def test_generation_routes_answer_501_on_an_embeddings_server(bert_server, path):
    r = httpx.post(bert_server.url + path, json={"prompt": "x"})
    assert _error(r, 501, "not_supported_error") == (
        "This server does not support completions. Start it without `--embeddings`")


def test_health_models_and_rerank_on_an_embeddings_server(bert_server):
    assert httpx.get(bert_server.url + "/health").json() == {"status": "ok"}
    models = httpx.get(bert_server.url + "/v1/models").json()
    assert models["models"][0]["capabilities"] == ["embedding"]
    r = httpx.post(bert_server.url + "/rerank", content=b"{not json")
    assert _error(r, 501, "not_supported_error") == (
        "This server does not support reranking. Start it with `--reranking`")


def test_pooling_none_gives_one_vector_per_token(bert, start_server):
    srv = start_server(bert.path, "--embeddings", "--pooling", "none", "--no-warmup")
    try:
        body = httpx.post(srv.url + "/embedding", json={"content": TEXTS[0]}).json()
        ids = bert.tok.encode(TEXTS[0]).ids
        rows = body[0]["embedding"]
        assert len(rows) == len(ids)
        np.testing.assert_allclose(rows, bert.hidden(ids), atol=1e-4)  # not normalized
        r = httpx.post(srv.url + "/v1/embeddings", json={"input": "x"})
        assert _error(r, 400, "invalid_request_error") == (
            "Pooling type 'none' is not OAI compatible. Please use a different pooling type")
    finally:
        srv.stop()


# -- rerank -----------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/rerank", "/reranking", "/v1/rerank", "/v1/reranking"])
def test_rerank_scores_are_the_classifier_logits_sorted(reranker, path):
    ref, srv = reranker
    r = httpx.post(srv.url + path, json={"query": QUERY, "documents": DOCS, "model": "rr"})
    assert r.status_code == 200
    body = r.json()
    assert list(body) == ["model", "object", "usage", "results"]
    assert body["model"] == "rr" and body["object"] == "list"
    want = [ref.score(QUERY, d) for d in DOCS]
    order = sorted(range(len(DOCS)), key=lambda i: -want[i])
    assert [e["index"] for e in body["results"]] == order
    for e in body["results"]:
        assert list(e) == ["index", "relevance_score"]
        assert e["relevance_score"] == pytest.approx(want[e["index"]], abs=1e-4)
    n = sum(len(ref.tok.encode(QUERY, d).ids) for d in DOCS)
    assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}


def test_rerank_top_n_and_tei_return_text(reranker):
    ref, srv = reranker
    want = [ref.score(QUERY, d) for d in DOCS]
    order = sorted(range(len(DOCS)), key=lambda i: -want[i])
    top = httpx.post(srv.url + "/v1/rerank",
                     json={"query": QUERY, "documents": DOCS, "top_n": 2}).json()["results"]
    assert [e["index"] for e in top] == order[:2]
    tei = httpx.post(srv.url + "/rerank",
                     json={"query": QUERY, "texts": DOCS, "return_text": True}).json()
    assert isinstance(tei, list) and [e["index"] for e in tei] == order
    assert all(list(e) == ["index", "score", "text"] and e["text"] == DOCS[e["index"]]
               for e in tei)
    # return_text is TEI's alone: the Jina envelope never carries text
    jina = httpx.post(srv.url + "/rerank", json={"query": QUERY, "documents": DOCS,
                                                 "return_text": True}).json()
    assert all("text" not in e for e in jina["results"])


@pytest.mark.parametrize("body,message", [
    ({"documents": ["a"]}, '"query" must be provided'),
    ({"query": 5, "documents": ["a"]}, '"query" must be a string'),
    ({"query": "q"}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": []}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": ["a", 5]}, '"documents" must be a non-empty string array'),
])
def test_bad_rerank_input_gets_upstreams_400(reranker, body, message):
    _, srv = reranker
    r = httpx.post(srv.url + "/v1/rerank", json=body)
    assert _error(r, 400, "invalid_request_error") == message
    assert httpx.get(srv.url + "/health").json() == {"status": "ok"}


def test_embeddings_and_generation_answer_501_on_a_reranking_server(reranker):
    _, srv = reranker
    r = httpx.post(srv.url + "/v1/embeddings", json={"input": "x"})
    assert _error(r, 501, "not_supported_error") == (
        "This server does not support embeddings. Start it with `--embeddings`")
    r = httpx.post(srv.url + "/completion", json={"prompt": "x"})
    assert _error(r, 501, "not_supported_error") == (
        "This server does not support completions. Start it without `--reranking`")
    assert httpx.get(srv.url + "/v1/models").json()["models"][0]["capabilities"] == ["rerank"]


# -- startup -----------------------------------------------------------------------------

@pytest.mark.parametrize("kind,flag,needle", [
    (None, "--embeddings", "--embeddings needs an encoder checkpoint"),
    ("tiny", "--reranking", "--reranking needs a reranker"),
    ("tiny-bert", "--reranking", "--reranking needs a reranker"),
])
def test_a_mode_nothing_can_serve_fails_at_startup(start_server, tmp_path, kind, flag, needle):
    if kind is None:  # neither an encoder nor anything mlx-lm can build
        (tmp_path / "config.json").write_text('{"model_type": "no-such-family"}')
        (tmp_path / "model.safetensors").write_bytes(b"")
    srv = start_server(tmp_path if kind is None else _fixture(kind), flag, wait_ready=False)
    assert srv.wait(60) != 0
    out = srv.drain()
    assert needle in out and "main: model loaded" not in out, out


# -- side models beside a chat model (mlxcel: --embedding-model, --reranker-model) -------------

@pytest.fixture(scope="module")
def side_server(bert, tiny_model, start_server):
    rr = Ref("tiny-xlmr-reranker")
    srv = start_server(tiny_model, "--embedding-model", str(bert.path),
                       "--reranker-model", str(rr.path), "-np", "2", "--no-warmup")
    return rr, srv


def test_side_models_serve_beside_chat(side_server, bert):
    rr, srv = side_server
    data = httpx.post(srv.url + "/v1/embeddings", json={"input": TEXTS}).json()
    assert data["model"] == bert.path.name
    for text, d in zip(TEXTS, data["data"]):
        np.testing.assert_allclose(d["embedding"], normalized(bert.pooled(text, "mean"), 2),
                                   atol=1e-4)
    body = httpx.post(srv.url + "/v1/rerank", json={"query": QUERY, "documents": DOCS}).json()
    assert body["model"] == rr.path.name
    for e in body["results"]:
        assert e["relevance_score"] == pytest.approx(rr.score(QUERY, DOCS[e["index"]]), abs=1e-4)
    done = httpx.post(srv.url + "/completion", json={"prompt": "hi", "n_predict": 4}).json()
    assert done["tokens_predicted"] == 4


def test_side_models_are_listed_with_their_capabilities(side_server, bert):
    rr, srv = side_server
    models = httpx.get(srv.url + "/v1/models").json()
    assert [m["capabilities"] for m in models["models"]] == [["completion"], ["embedding"],
                                                             ["rerank"]]
    assert [m["id"] for m in models["data"][1:]] == [bert.path.name, rr.path.name]
    caps = httpx.get(srv.url + "/props").json()["capabilities"]
    assert caps == {"generation": True, "restricted_by": None,
                    "embedding": {"model": bert.path.name, "pooling": "mean",
                                  "embd_normalize": 2},
                    "rerank": {"model": rr.path.name, "pooling": "rank"}}


def test_embeddings_interleave_with_a_chat_stream(side_server):
    """A stream keeps going while embedding batches run, and both finish."""
    import threading

    _, srv = side_server
    results: dict = {}

    def embed():
        results["embed"] = [httpx.post(srv.url + "/v1/embeddings",
                                       json={"input": TEXTS * 8}).status_code
                            for _ in range(5)]

    t = threading.Thread(target=embed)
    with httpx.stream("POST", srv.url + "/completion", timeout=60,
                      json={"prompt": "hello", "n_predict": 48, "stream": True,
                            "ignore_eos": True}) as r:
        t.start()
        frames = [line for line in r.iter_lines() if line.startswith("data: ")]
    t.join(60)
    assert results["embed"] == [200] * 5
    final = json.loads(frames[-1][len("data: "):])
    assert final["stop"] is True and final["tokens_predicted"] == 48


def test_a_side_model_of_the_wrong_kind_fails_at_startup(tiny_model, start_server):
    srv = start_server(tiny_model, "--reranker-model", str(_fixture("tiny-bert")),
                       wait_ready=False)
    assert srv.wait(60) != 0
    out = srv.drain()
    assert "--reranker-model needs a reranker" in out, out


# -- decoder embedders through mlx-lm -----------------------------------------------------

def test_a_causal_checkpoint_embeds_with_mlx_lms_hidden_states(tiny_model, start_server):
    from mlx_lm import load as lm_load

    lm, _ = lm_load(str(tiny_model))
    tok = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))

    def hidden(text):
        ids = tok.encode(text).ids
        return np.array(lm.model(mx.array([ids])))[0]

    srv = start_server(tiny_model, "--embeddings", "--pooling", "last", "--no-warmup")
    try:
        data = httpx.post(srv.url + "/v1/embeddings", json={"input": TEXTS}).json()["data"]
        for text, d in zip(TEXTS, data):
            np.testing.assert_allclose(d["embedding"], normalized(hidden(text)[-1], 2),
                                       atol=1e-4)
        one = httpx.post(srv.url + "/v1/embeddings", json={"input": TEXTS[2]}).json()["data"]
        np.testing.assert_allclose(one[0]["embedding"], data[2]["embedding"], atol=1e-5)
        mean = httpx.post(srv.url + "/embedding",
                          json={"content": TEXTS[0], "embd_normalize": -1}).json()
        assert len(mean[0]["embedding"]) == 1
        r = httpx.post(srv.url + "/completion", json={"prompt": "x"})
        assert _error(r, 501, "not_supported_error").endswith("without `--embeddings`")
    finally:
        srv.stop()
    # without --pooling or a 1_Pooling: "none", as upstream gives a GGUF that names none
    srv = start_server(tiny_model, "--embeddings", "--no-warmup")
    try:
        rows = httpx.post(srv.url + "/embedding", json={"content": TEXTS[0]}).json()[0]
        np.testing.assert_allclose(rows["embedding"], hidden(TEXTS[0]), atol=1e-4)
        r = httpx.post(srv.url + "/v1/embeddings", json={"input": "x"})
        assert _error(r, 400, "invalid_request_error").startswith("Pooling type 'none'")
    finally:
        srv.stop()


def test_a_side_model_for_the_role_m_already_serves_fails_at_startup(bert, start_server):
    srv = start_server(bert.path, "--embeddings", "--embedding-model", str(bert.path),
                       wait_ready=False)
    assert srv.wait(60) != 0
    out = srv.drain()
    assert "--embedding-model names a second model for what -m already serves" in out, out


def test_an_embeddings_server_can_rerank_with_a_side_reranker(bert, start_server):
    rr = Ref("tiny-bert-reranker")
    srv = start_server(bert.path, "--embeddings", "--reranker-model", str(rr.path),
                       "--no-warmup")
    try:
        body = httpx.post(srv.url + "/rerank", json={"query": QUERY, "documents": DOCS}).json()
        for e in body["results"]:
            assert e["relevance_score"] == pytest.approx(rr.score(QUERY, DOCS[e["index"]]),
                                                         abs=1e-4)
        data = httpx.post(srv.url + "/v1/embeddings", json={"input": TEXTS[0]}).json()["data"]
        np.testing.assert_allclose(data[0]["embedding"],
                                   normalized(bert.pooled(TEXTS[0], "mean"), 2), atol=1e-4)
        caps = httpx.get(srv.url + "/props").json()["capabilities"]
        assert caps["generation"] is False and caps["restricted_by"] == "--embeddings"
        assert caps["rerank"] == {"model": rr.path.name, "pooling": "rank"}
        assert caps["embedding"]["model"] == str(bert.path)  # -m's name: the value as written
        models = httpx.get(srv.url + "/v1/models").json()
        assert [m["capabilities"] for m in models["models"]] == [["embedding"], ["rerank"]]
        assert body["model"] == rr.path.name
    finally:
        srv.stop()


# -- a storm of malformed bodies: upstream's envelopes, never a 5xx, server unaffected --------

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                     st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
_values = st.recursive(_scalars, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=6), kids, max_size=4)),
    max_leaves=10)
_ids = st.lists(st.one_of(st.integers(-5, 2000), st.integers(-2**70, 2**70), st.text(max_size=4)),
                max_size=5)
EMBED_FIELDS = {"input": st.one_of(_values, _ids, st.lists(_ids, max_size=3)),
                "content": _values, "encoding_format": _values, "embd_normalize": _values,
                "model": _values}
RERANK_FIELDS = {"query": _values, "documents": st.one_of(_values, st.lists(
    st.text(max_size=8), max_size=4)), "texts": _values, "top_n": _values,
    "return_text": _values, "model": _values}


@st.composite
def _bodies(draw, fields):
    if draw(st.integers(0, 9)) == 0:
        return json.dumps(draw(_values)).encode()
    names = draw(st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=4, unique=True))
    return json.dumps({name: draw(fields[name]) for name in names}).encode()


def _well_formed(r: httpx.Response) -> None:
    body = r.json()
    if r.status_code == 200:
        return
    err = body["error"]
    assert err["code"] == r.status_code and r.status_code < 500, err
    assert isinstance(err["message"], str) and err["message"]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(["/embedding", "/v1/embeddings"]), body=_bodies(EMBED_FIELDS))
def test_embedding_storm(bert_server, path, body):
    r = httpx.post(bert_server.url + path, content=body, timeout=60)
    _well_formed(r)
    assert httpx.get(bert_server.url + "/health").status_code == 200


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=_bodies(RERANK_FIELDS))
def test_rerank_storm(reranker, body):
    _, srv = reranker
    r = httpx.post(srv.url + "/v1/rerank", content=body, timeout=60)
    _well_formed(r)
    assert httpx.get(srv.url + "/health").status_code == 200


# -- Qwen3-Reranker-style decoder rerankers --------------------------------------------------

UPSTREAM_QWEN3_RERANK = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the "
    "Query and the Instruct provided. Note that the answer can only be \"yes\" or \"no\"."
    "<|im_end|>\n<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant "
    "passages that answer the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_a_qwen3_reranker_scores_the_yes_share_of_upstreams_prompt(tiny_model, tmp_path,
                                                                   start_server):
    from mlx_lm import load as lm_load

    path = qwen3_reranker(tiny_model, tmp_path)
    lm, _ = lm_load(str(path))
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    yes, no = tok.token_to_id("yes"), tok.token_to_id("no")

    def score(doc):
        prompt = UPSTREAM_QWEN3_RERANK.replace("{query}", QUERY).replace("{document}", doc)
        logits = np.array(lm(mx.array([tok.encode(prompt, add_special_tokens=False).ids])))
        pair = logits[0, -1, [yes, no]].astype(np.float64)
        e = np.exp(pair - pair.max())
        return e[0] / e.sum()

    srv = start_server(path, "--reranking", "--no-warmup")
    try:
        body = httpx.post(srv.url + "/v1/rerank", json={"query": QUERY, "documents": DOCS}).json()
        want = [score(d) for d in DOCS]
        assert [e["index"] for e in body["results"]] == sorted(range(len(DOCS)),
                                                               key=lambda i: -want[i])
        for e in body["results"]:
            assert e["relevance_score"] == pytest.approx(want[e["index"]], abs=1e-4)
    finally:
        srv.stop()

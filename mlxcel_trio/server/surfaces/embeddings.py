"""POST /embedding, /embeddings (native), /v1/embeddings (OpenAI) and the
four rerank routes, with llama-server's fields, shapes and wording.

Shapes (upstream's handle_embeddings_impl / post_rerank and their
formatters): the native answer is a bare array of {embedding, index} whose
embedding is an array of vectors (one per input, or one per token with
pooling none); the OpenAI one is {data, model, object, usage}, each item
{embedding, index, object} (+ encoding_format, the embedding then base64 of
its float32 bytes).  Sending `content` instead of `input` asks for the
native shape on every path.  Rerank answers the Jina envelope {model,
object, usage, results: [{index, relevance_score}]}, or, when the body
spells the list `texts` (TEI), a bare array of {index, score} (+ text with
return_text); results sorted by score, descending, cut to top_n.  Keys
come in the order upstream inserts them.

The body is read only once the route knows it serves (a server without
the model answers the 501 whatever the body, as upstream).  Inputs are
tokenized off the event loop (request/served.py off_loop) with the encoder's
own tokenizer; each input is one `EmbedJob`, and the engine batches them.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np

from ...protocol.records import Embedded, EmbedJob
from ..http.errors import ApiError, engine_failure, json_response, not_supported, type_error
from ..request.jobs import run_all, tokenize_prompts
from ..request.served import Served, off_loop


def _json_value(body: dict, key: str, default: Any, ok) -> Any:
    """upstream's json_value: the value when present, not null and of the
    wanted type, else the default."""
    value = body.get(key)
    return value if value is not None and ok(value) else default


def _is_int(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _listed(body: dict, served: Served, side, results: list[Embedded], key: str,
            items: list):
    """The OpenAI-style list envelope both families answer with: the model
    (the request's own string, else the served name), the usage counted over
    every input, and the items under `key`."""
    n_tokens = sum(ev.n_tokens for ev in results)
    return json_response({
        "model": _json_value(body, "model", _model_name(served, side),
                             lambda v: isinstance(v, str)),
        "object": "list",
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        key: items,
    })


def _model_name(served: Served, side) -> str:
    """The name a response carries when the body names none: -m's, or the
    side model's id (its directory name) beside a chat model."""
    info = served.bridge.info
    if not info.generates and Path(side.path) == Path(info.path):
        return served.model_name
    return Path(side.path).name


def _embedder(served: Served):
    info = served.bridge.info
    return None if info is None else info.embedder


def _reranker(served: Served):
    info = served.bridge.info
    return None if info is None else info.reranker


async def _run(served: Served, jobs: list[EmbedJob]) -> list[Embedded]:
    return await run_all(served, jobs, Embedded, "embedding")


# -- embeddings --------------------------------------------------------------------

async def embeddings(served: Served, default_normalize: int, read_body, oai: bool):
    emb = _embedder(served)
    if emb is None:
        return not_supported("embeddings", "--embeddings")
    if oai and emb.pooling == "none":
        raise ApiError("Pooling type 'none' is not OAI compatible. Please use a different "
                       "pooling type")
    body = await read_body()
    if not isinstance(body, dict):
        body = {}
    if "input" in body:
        prompt = body["input"]
    elif "content" in body:
        oai = False  # "content" is not OpenAI's: the native shape
        prompt = body["content"]
    else:
        raise ApiError('"input" or "content" must be provided')
    use_base64 = False
    if "encoding_format" in body:
        fmt = body["encoding_format"]
        if not isinstance(fmt, str):
            raise type_error("string", fmt)
        if fmt == "base64":
            use_base64 = True
        elif fmt != "float":
            raise ApiError("The format to return the embeddings in. Can be either float "
                           "or base64")
    vocab = served.bridge.embed_vocab
    prompts = await off_loop(served, tokenize_prompts, {"prompt": prompt}, vocab)
    if any(not p for p in prompts):
        raise engine_failure("empty_input")
    normalize = default_normalize
    if "embd_normalize" in body:
        value = body["embd_normalize"]
        if not (_is_int(value) or isinstance(value, bool)):
            raise type_error("number", value)
        # the C++ int member: a number past int32 is clamped rather than wrapped
        normalize = max(-2**31, min(2**31 - 1, int(value)))
    bridge = served.bridge
    jobs = [EmbedJob(bridge.next_job_id(), tuple(p), emb.pooling, normalize) for p in prompts]
    results = await _run(served, jobs)
    if not oai:
        return json_response([{"index": i, "embedding": ev.vectors.tolist()}
                              for i, ev in enumerate(results)])
    data = []
    for i, ev in enumerate(results):
        vec = ev.vectors[0]
        if use_base64:
            data.append({"embedding": base64.b64encode(
                             np.asarray(vec, "<f4").tobytes()).decode("ascii"),
                         "index": i, "object": "embedding", "encoding_format": "base64"})
        else:
            data.append({"embedding": vec.tolist(), "index": i, "object": "embedding"})
    return _listed(body, served, emb, results, "data", data)


# -- rerank --------------------------------------------------------------------------

def _strings(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _pairs(vocab, query: str, documents: list[str],
           template: str | None) -> list[tuple[list[int], list[int] | None]]:
    """Each document's input: the reranker's prompt filled in (upstream's
    format_prompt_rerank: {query} then {document} replaced, no BOS), else the
    tokenizer's pair template with its token type ids."""
    if template is None:
        return [vocab.tokenize_pair(query, doc) for doc in documents]
    return [(vocab.tokenize(template.replace("{query}", query).replace("{document}", doc),
                            False, True), None) for doc in documents]


async def rerank(served: Served, read_body):
    ranker = _reranker(served)
    if ranker is None:
        return not_supported("reranking", "--reranking")
    body = await read_body()
    if not isinstance(body, dict):
        body = {}
    tei = "texts" in body
    if "query" not in body:
        raise ApiError('"query" must be provided')
    query = body["query"]
    if not isinstance(query, str):
        raise ApiError('"query" must be a string')
    documents = _json_value(body, "documents",
                            _json_value(body, "texts", [], _strings), _strings)
    if not documents:
        raise ApiError('"documents" must be a non-empty string array')
    top_n = int(_json_value(body, "top_n", len(documents), _is_int))
    pairs = await off_loop(served, _pairs, served.bridge.rerank_vocab, query, documents,
                           ranker.rerank_template)
    bridge = served.bridge
    jobs = [EmbedJob(bridge.next_job_id(), tuple(ids), "rank", -1,
                     None if types is None else tuple(types)) for ids, types in pairs]
    results = await _run(served, jobs)
    label = "score" if tei else "relevance_score"
    return_text = tei and _json_value(body, "return_text", False,
                                      lambda v: isinstance(v, bool)) is True
    elements = []
    for i, ev in enumerate(results):
        elem: dict[str, Any] = {"index": i, label: ev.score}
        if return_text:
            elem["text"] = documents[i]
        elements.append(elem)
    elements.sort(key=lambda e: -e[label])  # stable: ties keep document order
    elements = elements[:max(0, top_n)]
    if tei:
        return json_response(elements)
    return _listed(body, served, ranker, results, "results", elements)

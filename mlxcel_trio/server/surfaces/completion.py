"""POST /completion and /completions: llama-server's native completion shape.

Non-streaming answers one object, or a JSON array when the request makes
several results (several prompts, or n_cmpl > 1).  Streaming sends one
partial frame per token that completes a UTF-8 sequence (its id in
`tokens`, `id_slot: -1`), optional prompt_progress frames, then each
result's full object with empty content, and no [DONE] sentinel.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from quart import Response

from ...protocol.records import Finished, PromptProgress, TokenPiece
from ..request.media_input import audio_of, vision_of
from ..request.jobs import (
    make_jobs,
    resolve,
    run_all,
    tokenize_prompts,
)
from ..request.served import Served, off_loop
from ..request import grammar_fields as grammar
from ..request.schema import NativeRequest
from ..request.settings import generation_settings
from ..http.errors import json_response
from ..http.sse import frame
from .streaming import stream_jobs


def _project(obj: dict, paths) -> dict:
    """response_fields: each path is walked through the object and stored
    under the whole path string; a path that does not resolve is omitted.
    An empty array, or anything but an array of strings, leaves the object
    whole (upstream projects only a non-empty list)."""
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
        return obj
    out: dict[str, Any] = {}
    for path in paths:
        if not path:
            continue
        node: Any = obj
        for part in path.split("/"):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            out[path] = node
    return out


FLOAT_LOWEST = float(np.finfo(np.float32).min)


def _valid_utf8_prefix(raw: bytes) -> int:
    """validate_utf8: the length without a multi-byte sequence cut off at
    the end."""
    n = len(raw)
    for i in range(1, min(4, n) + 1):
        c = raw[n - i]
        if (c & 0xE0) == 0xC0 and i < 2 or (c & 0xF0) == 0xE0 and i < 3 \
                or (c & 0xF8) == 0xF0 and i < 4:
            return n - i
    return n


def _logprob(p: float) -> float:
    """completion_token_output::logarithm: log in float, 0 -> lowest float."""
    return FLOAT_LOWEST if p == 0.0 else float(np.log(np.float32(p)))


class ProbsRenderer:
    """completion_probabilities entries, shaped as upstream's
    probs_vector_to_json: {id, token, bytes, logprob|prob,
    top_logprobs|top_probs: [{id, token, bytes, logprob|prob}]}."""

    def __init__(self, served: Served, post: bool) -> None:
        self.vocab = served.bridge.vocab
        self.special = served.bridge.config.special
        self.post = post
        self.key, self.top_key = ("prob", "top_probs") if post else ("logprob", "top_logprobs")

    def _piece(self, token: int) -> bytes:
        table = self.vocab.table
        if not self.special and table.is_special(token):
            return b""
        return self.vocab.piece(token)

    def _one(self, token: int, p: float) -> dict:
        raw = self._piece(token)
        text = raw[:_valid_utf8_prefix(raw)].decode("utf-8", "replace")
        return {"id": token, "token": text, "bytes": list(raw),
                self.key: p if self.post else _logprob(p)}

    def entry(self, tp) -> dict:
        out = self._one(tp.token, tp.prob)
        out[self.top_key] = [self._one(t, p) for t, p in tp.top]
        return out

    def entries(self, probs) -> list[dict]:
        return [self.entry(tp) for tp in probs]


def final_probs(served: Served, values: NativeRequest, fin: Finished) -> list[dict] | None:
    """The non-streamed report: a stop word's own tokens are left out."""
    probs = list(fin.probs)
    if values.n_probs <= 0 or not probs:
        return None
    if fin.stop_type == "word":
        n = len(served.bridge.vocab.tokenize(fin.stopping_word, add_special=False,
                                             parse_special=False))
        probs = probs[:len(probs) - min(n, len(probs))]
    if not probs:
        return None
    return ProbsRenderer(served, values.post_sampling_probs).entries(probs)


def final_object(served: Served, values: NativeRequest, fin: Finished, prompt: list[int],
                 index: int, streamed: bool) -> dict:
    n = len(fin.tokens)
    obj = {
        "index": index,
        "content": "" if streamed else fin.content,
        "tokens": list(fin.tokens) if values.return_tokens and not streamed else [],
        "id_slot": fin.id_slot,
        "stop": True,
        "model": served.model_name,
        "tokens_predicted": n,
        "tokens_evaluated": fin.n_prompt,
        "generation_settings": generation_settings(values, served.speculative.names),
        "prompt": served.bridge.vocab.detokenize(prompt),
        "has_new_line": "\n" in fin.content,
        "truncated": fin.truncated,
        "stop_type": fin.stop_type,
        "stopping_word": fin.stopping_word,
        "tokens_cached": max(0, fin.n_prompt + n - 1),
        "timings": fin.timings.to_json(),
    }
    if not streamed:
        probs = final_probs(served, values, fin)
        if probs is not None:
            obj["completion_probabilities"] = probs
    return obj


async def complete(served: Served, body: Any) -> Response:
    values = resolve(body, served)
    values = await grammar.prepare(served, values)
    prompts = await off_loop(served, tokenize_prompts, body, served.bridge.vocab,
                             served.bridge.info.n_ctx_slot, vision_of(served),
                             served.state.media, audio_of(served))
    jobs = make_jobs(served, values, prompts, body)
    if values.stream:
        return await _stream(served, values, jobs)
    results = [
        _project(final_object(served, values, fin, list(job.prompt), i, streamed=False),
                 values.response_fields)
        for i, (job, fin) in enumerate(zip(jobs, await run_all(served, jobs)))
    ]
    # one result answers an object; several (prompts x n_cmpl) an array
    return json_response(results[0] if len(results) == 1 else results)


def partial_object(ev: TokenPiece | PromptProgress, index: int, n_prompt: int,
                   per_token_timings: bool, probs: "ProbsRenderer") -> dict:
    """server_task_result_cmpl_partial::to_json_non_oaicompat: a streamed
    frame of /completion, and the __verbose of a streamed /v1/completions
    chunk.  A progress update carries a value-initialized token (id 0) and the
    slot's timings only with timings_per_token; a token carries them then
    and on the last frame."""
    if isinstance(ev, PromptProgress):
        obj = {"index": index, "content": "", "tokens": [0], "stop": False, "id_slot": -1,
               "tokens_predicted": 0, "tokens_evaluated": n_prompt}
        if per_token_timings:
            obj["timings"] = ev.timings().to_json()
        obj["prompt_progress"] = ev.to_json()
        return obj
    obj = {"index": index, "content": ev.text, "tokens": [ev.token], "stop": False,
           "id_slot": -1, "tokens_predicted": ev.n_decoded, "tokens_evaluated": n_prompt}
    if per_token_timings or ev.last:
        obj["timings"] = ev.timings.to_json()
    if ev.probs is not None and ev.probs.top:
        obj["completion_probabilities"] = [probs.entry(ev.probs)]
    return obj


async def _stream(served: Served, values: NativeRequest, jobs: list) -> Response:
    """Frames of every job interleaved as they come, told apart by index."""
    per_token_timings = values.timings_per_token
    probs = ProbsRenderer(served, values.post_sampling_probs)
    index = {job.id: i for i, job in enumerate(jobs)}
    prompt = {job.id: job.prompt for job in jobs}

    def render(ev):
        i = index[ev.job_id]
        n_prompt = len(prompt[ev.job_id])
        if isinstance(ev, TokenPiece):
            if not ev.complete and not ev.text:
                return ()  # mid-UTF-8 with nothing to show: upstream sends no frame
            return (frame(partial_object(ev, i, n_prompt, per_token_timings, probs)),)
        if isinstance(ev, PromptProgress):
            return (frame(partial_object(ev, i, n_prompt, per_token_timings, probs)),)
        if isinstance(ev, Finished):
            obj = final_object(served, values, ev, list(prompt[ev.job_id]), i, streamed=True)
            return (frame(_project(obj, values.response_fields)),)
        return ()  # Started

    return await stream_jobs(served, jobs, render, values.sse_ping_interval)

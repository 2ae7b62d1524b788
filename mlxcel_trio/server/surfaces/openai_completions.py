"""POST /v1/completions: the OpenAI text-completion shape.

The request goes through the same native field table (upstream does the
same at this release); only the rendering differs.  Key order follows
upstream's to_json_oaicompat: choices, created, model, system_fingerprint,
object, usage (final results only), id, then the optional timings,
prompt_progress and __verbose.  Streams end with `data: [DONE]`.
"""

from __future__ import annotations

import secrets
from typing import Any

from quart import Response

from ...protocol.records import Finished, PromptProgress, TokenPiece
from ..request.media_input import audio_of, vision_of
from ..request.jobs import (
    make_jobs,
    now_s,
    resolve,
    run_all,
    tokenize_prompts,
)
from ..request.served import Served, off_loop
from ..request import grammar_fields as grammar
from ..request.schema import NativeRequest
from ..http.errors import json_response
from .completion import ProbsRenderer, final_object, final_probs, partial_object
from ..http.resources import request_resources
from ..http.sse import DONE, frame
from .streaming import stream_jobs


def _finish_reason(fin: Finished) -> str:
    return "stop" if fin.stop_type in ("word", "eos") else "length"


def _usage(finished: list[Finished]) -> dict:
    n = sum(len(f.tokens) for f in finished)
    p = sum(f.n_prompt for f in finished)
    cached = sum(f.timings.cache_n for f in finished)
    return {"completion_tokens": n, "prompt_tokens": p, "total_tokens": n + p,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _choice(text: str, index: int, finish_reason: str | None, probs=None) -> dict:
    """logprobs: null, or {"content": completion_probabilities} when the
    request asked for n_probs / logprobs."""
    logprobs = {"content": probs} if probs else None
    return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish_reason}


class _Render:
    """The envelope shared by a request's results."""

    def __init__(self, served: Served, values: NativeRequest) -> None:
        self.served, self.values = served, values
        self.id = "cmpl-" + secrets.token_hex(16)
        self.created = now_s()

    def envelope(self, choices: list, usage: dict | None = None) -> dict[str, Any]:
        res = {"choices": choices, "created": self.created, "model": self.served.model_name,
               "system_fingerprint": self.served.build_info, "object": "text_completion"}
        if usage is not None:
            res["usage"] = usage
        res["id"] = self.id
        return res

    def final(self, fins: list[Finished], jobs: list, streamed: bool) -> dict[str, Any]:
        res = self.envelope([_choice("" if streamed else f.content, jobs.index(job),
                                     _finish_reason(f),
                                     None if streamed else final_probs(self.served, self.values, f))
                             for job, f in fins],
                            _usage([f for _, f in fins]))
        if self.values.verbose:  # upstream: __verbose, then timings
            job, fin = fins[0]
            res["__verbose"] = final_object(self.served, self.values, fin, list(job.prompt),
                                            jobs.index(job), streamed)
        res["timings"] = fins[0][1].timings.to_json()
        return res


async def complete_v1(served: Served, body: Any, scope: str) -> Response:
    values = resolve(body, served)
    values = await grammar.prepare(served, values)
    prompts = await off_loop(served, tokenize_prompts, body, served.bridge.vocab,
                             served.bridge.info.n_ctx_slot, vision_of(served),
                             served.state.media, audio_of(served))
    jobs = make_jobs(served, values, prompts, body, control=True)
    controlled = tuple(job.id for job in jobs) if values.reasoning_control else None
    out = _Render(served, values)
    # POST /v1/chat/completions/control addresses it by its id while it runs
    if not values.stream:
        served.state.control.register(out.id, scope, controlled, request=request_resources())
        finished = await run_all(served, jobs)
        # several results come back as the choices of one object, as upstream
        return json_response(out.final(list(zip(jobs, finished)), jobs, streamed=False))

    by_id = {job.id: job for job in jobs}
    index = {job.id: i for i, job in enumerate(jobs)}
    per_token_timings = values.timings_per_token
    probs = ProbsRenderer(served, values.post_sampling_probs)

    def verbose(res: dict, ev) -> dict:
        """upstream's partial chunk under -v: __verbose (the native frame of the
        same update) ahead of timings and prompt_progress."""
        if values.verbose:
            res["__verbose"] = partial_object(ev, index[ev.job_id],
                                              len(by_id[ev.job_id].prompt),
                                              per_token_timings, probs)
        return res

    def render(ev):
        if isinstance(ev, TokenPiece):
            if not ev.complete and not ev.text:
                return ()  # mid-UTF-8 with nothing to show: no frame, as upstream
            entry = [probs.entry(ev.probs)] if ev.probs is not None and ev.probs.top else None
            res = verbose(out.envelope([_choice(ev.text, index[ev.job_id], None, entry)]), ev)
            if per_token_timings or ev.last:
                res["timings"] = ev.timings.to_json()
            return (frame(res),)
        if isinstance(ev, PromptProgress):
            res = verbose(out.envelope([_choice("", index[ev.job_id], None)]), ev)
            if per_token_timings:
                res["timings"] = ev.timings().to_json()
            res["prompt_progress"] = ev.to_json()
            return (frame(res),)
        if isinstance(ev, Finished):
            return (frame(out.final([(by_id[ev.job_id], ev)], jobs, streamed=True)),)
        return ()

    return await stream_jobs(
        served, jobs, render, values.sse_ping_interval, trailer=DONE,
        opened=lambda handle: served.state.control.register(out.id, scope, controlled,
                                                            handle=handle))

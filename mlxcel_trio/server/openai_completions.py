"""POST /v1/completions: the OpenAI text-completion shape.

The request goes through the same native field table (upstream does the
same at this release); only the rendering differs.  Streams end with
`data: [DONE]`.
"""

from __future__ import annotations

import secrets
from typing import Any

from quart import Response

from ..engine.records import Finished, TokenPiece
from .completion import Served, make_job, now_s, resolve, run_to_end, tokenize_prompts
from .errors import ApiError, json_response
from .sse import DONE, event_stream, first_event, frame


def _finish_reason(fin: Finished) -> str:
    return "length" if fin.stop_type == "limit" else "stop"


def _usage(fin: Finished) -> dict:
    n = len(fin.tokens)
    return {"completion_tokens": n, "prompt_tokens": fin.n_prompt, "total_tokens": n + fin.n_prompt}


def _envelope(served: Served, cmpl_id: str, created: int, choices: list) -> dict[str, Any]:
    return {"choices": choices, "created": created, "model": served.model_name,
            "system_fingerprint": served.build_info, "object": "text_completion",
            "id": cmpl_id}


async def complete_v1(served: Served, body: Any) -> Response:
    values = resolve(body, served)
    prompts = tokenize_prompts(body, served.bridge.vocab)
    if len(prompts) != 1:
        raise ApiError("multiple prompts are not supported on /v1/completions")
    prompt = prompts[0]
    cmpl_id = "cmpl-" + secrets.token_hex(16)
    created = now_s()
    job = make_job(served, values, prompt, body)
    if not values["stream"]:
        fin = await run_to_end(served, job)
        res = _envelope(served, cmpl_id, created, [{
            "text": fin.content, "index": 0, "logprobs": None,
            "finish_reason": _finish_reason(fin)}])
        res["usage"] = _usage(fin)
        res["timings"] = fin.timings.to_json()
        return json_response(res)

    handle = served.bridge.open(job)
    first = await first_event(handle)

    def render(ev):
        if isinstance(ev, TokenPiece) and ev.text:  # mid-UTF-8 pieces may carry text too
            return (frame(_envelope(served, cmpl_id, created, [{
                "text": ev.text, "index": 0, "logprobs": None, "finish_reason": None}])),)
        if isinstance(ev, Finished):
            res = _envelope(served, cmpl_id, created, [{
                "text": "", "index": 0, "logprobs": None,
                "finish_reason": _finish_reason(ev)}])
            res["usage"] = _usage(ev)
            res["timings"] = ev.timings.to_json()
            return (frame(res),)
        return ()

    return Response(event_stream(handle, first, render, values["sse_ping_interval"], DONE),
                    content_type="text/event-stream")

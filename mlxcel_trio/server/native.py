"""POST /completion and /completions: llama-server's native completion shape.

Non-streaming answers one object (a JSON array when the prompt holds several
prompts).  Streaming sends one partial frame per token that completes a
UTF-8 sequence (its id in `tokens`, `id_slot: -1`), optional prompt_progress
frames, then the full object with empty content as the last frame, and no
[DONE] sentinel.
"""

from __future__ import annotations

from typing import Any

import trio
from quart import Response

from ..engine.records import Finished, PromptProgress, Started, TokenPiece
from .completion import (
    Served,
    generation_settings,
    make_job,
    resolve,
    run_to_end,
    tokenize_prompts,
)
from .errors import ApiError, json_response
from .sse import event_stream, first_event, frame


def _project(obj: dict, paths) -> dict:
    """response_fields: each path is walked through the object and stored
    under the whole path string; a path that does not resolve is omitted.
    Anything but an array of strings leaves the object whole."""
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
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


def final_object(served: Served, values: dict, fin: Finished, prompt: list[int],
                 index: int, streamed: bool) -> dict:
    n = len(fin.tokens)
    return {
        "index": index,
        "content": "" if streamed else fin.content,
        "tokens": list(fin.tokens) if values["return_tokens"] and not streamed else [],
        "id_slot": fin.id_slot,
        "stop": True,
        "model": served.model_name,
        "tokens_predicted": n,
        "tokens_evaluated": fin.n_prompt,
        "generation_settings": generation_settings(values),
        "prompt": served.bridge.vocab.detokenize(prompt),
        "has_new_line": "\n" in fin.content,
        "truncated": fin.truncated,
        "stop_type": fin.stop_type,
        "stopping_word": fin.stopping_word,
        "tokens_cached": max(0, fin.n_prompt + n - 1),
        "timings": fin.timings.to_json(),
    }


async def complete(served: Served, body: Any) -> Response:
    values = resolve(body, served)
    prompts = tokenize_prompts(body, served.bridge.vocab)
    if values["stream"]:
        return await _stream(served, values, body, prompts)
    results: list[dict | None] = [None] * len(prompts)

    async def one(i: int, prompt: list[int]) -> None:
        fin = await run_to_end(served, make_job(served, values, prompt, body))
        obj = final_object(served, values, fin, prompt, i, streamed=False)
        results[i] = _project(obj, values["response_fields"])

    if len(prompts) == 1:
        await one(0, prompts[0])
        return json_response(results[0])
    async with trio.open_nursery() as nursery:
        for i, p in enumerate(prompts):
            nursery.start_soon(one, i, p)
    return json_response(results)


async def _stream(served: Served, values: dict, body: dict, prompts: list[list[int]]) -> Response:
    # Upstream interleaves several prompts' frames by index; not served yet.
    if len(prompts) != 1:
        raise ApiError("streaming with multiple prompts is not supported")
    prompt = prompts[0]
    handle = served.bridge.open(make_job(served, values, prompt, body))
    first = await first_event(handle)
    per_token_timings = values["timings_per_token"]
    n_prompt = len(prompt)

    def render(ev):
        if isinstance(ev, TokenPiece):
            if not ev.complete and not ev.text:
                return ()  # mid-UTF-8 with nothing to show: upstream sends no frame
            obj = {"index": 0, "content": ev.text, "tokens": [ev.token], "stop": False,
                   "id_slot": -1, "tokens_predicted": ev.n_decoded,
                   "tokens_evaluated": n_prompt}
            if per_token_timings or ev.last:
                obj["timings"] = ev.timings.to_json()
            return (frame(obj),)
        if isinstance(ev, PromptProgress):
            return (frame({"index": 0, "content": "", "tokens": [], "stop": False,
                           "id_slot": -1, "tokens_predicted": 0, "tokens_evaluated": n_prompt,
                           "prompt_progress": {"total": ev.total, "cache": ev.cache,
                                               "processed": ev.processed,
                                               "time_ms": ev.time_ms}}),)
        if isinstance(ev, Finished):
            obj = final_object(served, values, ev, prompt, 0, streamed=True)
            return (frame(_project(obj, values["response_fields"])),)
        return ()  # Started

    assert isinstance(first, (Started, PromptProgress, TokenPiece, Finished))
    return Response(event_stream(handle, first, render, values["sse_ping_interval"]),
                    content_type="text/event-stream")

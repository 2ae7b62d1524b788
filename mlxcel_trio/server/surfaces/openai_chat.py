"""POST /v1/chat/completions (and /chat/completions), /apply-template and
the chat input-token counts.

The body becomes a `ChatPlan` (server/request/chat.py), the plan's tokens
become native jobs (one per `n`), and the output is parsed by a
`ChatStream` per job.  Shapes and key order follow upstream's
to_json_oaicompat_chat / _stream: a streamed response sends a role delta
first, one chunk per parser diff, then a chunk with the finish_reason and
an empty delta, an optional usage chunk (empty choices), `timings` on the
last chunk of each result, and `data: [DONE]`.  Because the non-streamed
message is the final parse of the same text and every delta is a
difference between parses, concatenated deltas equal the message.
"""

from __future__ import annotations

import secrets
import string
from typing import Any, Callable, Iterable

import attrs
from quart import Response

from ...grammar.compile import GrammarSpec
from ...chat.parser import ChatMsg, ChatStream, Diff
from ...protocol.records import Finished, PromptProgress, TokenPiece
from ..request import grammar_fields as grammar, budget_fields as reasoning_budget
from ..request.chat import ChatPlan, plan
from ..request.media_input import audio_of, chat_images, place, vision_of
from ..request.schema import NativeRequest
from ..request.jobs import make_jobs, now_s, resolve, run_all
from ..request.served import Served, off_loop
from ..http.errors import json_response
from ..http.request_tape import taped
from .completion import ProbsRenderer, final_object, final_probs
from ..http.resources import request_resources
from ..http.sse import DONE, frame
from .streaming import stream_jobs

_ALNUM = string.digits + string.ascii_uppercase + string.ascii_lowercase


def random_string() -> str:
    return taped(lambda: "".join(secrets.choice(_ALNUM) for _ in range(32)))


async def chat_plan(served: Served, config, body: Any, generating: bool = True) -> ChatPlan:
    """The chat plan, rendered and tokenized on a worker thread (a 5 MB
    message must not stall the event loop)."""
    # a server without image input refuses an image part before reading it
    body, images, marker = await chat_images(body, served)
    return await plan_with_media(served, body, images, marker, generating)


async def plan_with_media(served: Served, body: Any, images: list, marker: str,
                          generating: bool = True) -> ChatPlan:
    """The chat plan of a body whose media parts are already `marker` text,
    the decoded `images` (ImageInput / audio pieces) placed in its tokens."""
    settings = served.state.chat_settings()   # built on the loop: it logs
    limit = served.bridge.info.n_ctx_slot if generating else None
    vocab = served.bridge.vocab
    chat = await off_loop(served, plan, body, settings, vocab, generating, limit)
    if not images:
        return chat
    tokens = await off_loop(served, place, chat.prompt, marker, images, vision_of(served),
                            lambda piece, add: vocab.tokenize(piece, add, True), False,
                            audio_of(served))
    return attrs.evolve(chat, tokens=tokens)


def chat_jobs(served: Served, config, chat: ChatPlan, values: NativeRequest,
              control: bool = False) -> list:
    """The plan's engine jobs; a reasoning budget (or armed realtime control)
    wraps each job's grammar in the forced close of chat/budget.py."""
    jobs = make_jobs(served, values, [chat.tokens], chat.native,
                     template=served.state.chat_settings().template.source)
    if chat.budget < 0 and not control:
        return jobs
    settings = served.state.chat_settings()
    return reasoning_budget.wrap(
        jobs, served.bridge.vocab, budget=chat.budget, start=settings.think_start,
        ends=[settings.think_end], message=chat.budget_message,
        open_at_start=chat.thinking_open, control=control)


# -- shapes ---------------------------------------------------------------------------------

def message_json(msg: ChatMsg, alias: str | None = None) -> dict[str, Any]:
    """common_chat_msg::to_json_oaicompat for an assistant reply; `alias`
    (--reasoning-alias-field) repeats reasoning_content under that name."""
    out: dict[str, Any] = {"role": "assistant", "content": msg.content}
    if msg.reasoning_content:
        out["reasoning_content"] = msg.reasoning_content
        if alias:
            out[alias] = msg.reasoning_content
    if msg.tool_calls:
        out["tool_calls"] = [{"type": "function",
                              "function": {"name": c.name, "arguments": c.arguments},
                              "id": c.id} for c in msg.tool_calls]
    return out


def delta_json(diff: Diff, alias: str | None = None) -> dict[str, Any]:
    """server_chat_msg_diff_to_json_oaicompat (+ the reasoning alias)."""
    delta: dict[str, Any] = {}
    if diff.reasoning_content:
        delta["reasoning_content"] = diff.reasoning_content
        if alias:
            delta[alias] = diff.reasoning_content
    if diff.content:
        delta["content"] = diff.content
    if diff.tool_index is not None:
        call: dict[str, Any] = {"index": diff.tool_index}
        if diff.tool_id:
            call["id"] = diff.tool_id
            call["type"] = "function"
        if diff.tool_name or diff.tool_arguments:
            fn: dict[str, Any] = {}
            if diff.tool_name:
                fn["name"] = diff.tool_name
            if diff.tool_arguments:
                fn["arguments"] = diff.tool_arguments
            call["function"] = fn
        delta["tool_calls"] = [call]
    return delta


def finish_reason(fin: Finished, msg: ChatMsg) -> str:
    if fin.stop_type in ("word", "eos"):
        return "tool_calls" if msg.tool_calls else "stop"
    return "length"


def usage_json(fin: Finished) -> dict[str, Any]:
    n = len(fin.tokens)
    return {"completion_tokens": n, "prompt_tokens": fin.n_prompt,
            "total_tokens": n + fin.n_prompt,
            "prompt_tokens_details": {"cached_tokens": fin.timings.cache_n}}


def final_message(chat: ChatPlan, text: str) -> ChatMsg:
    stream = ChatStream(chat.syntax, chat.prefill, chat.echo)
    stream.update(text, final=True)
    return stream.msg


async def plan_jobs(served: Served, config, body: Any,
                    control: bool = False) -> tuple[ChatPlan, NativeRequest, list]:
    """A chat-shaped body to its plan, resolved native values (grammar
    compiled) and engine jobs: the start every generating chat route shares.
    `control`: the route offers realtime reasoning control (the request
    still has to arm it)."""
    chat = await chat_plan(served, config, body)
    values = resolve(chat.native, served)
    if chat.tool_grammar is not None and values.grammar_spec is None:
        # a forced call's arguments follow the tool's schema (a request's own
        # grammar or response_format, when it has one, is kept instead)
        values = attrs.evolve(values, grammar_spec=GrammarSpec("lark", chat.tool_grammar))
    values = await grammar.prepare(served, values)
    return chat, values, chat_jobs(served, config, chat, values, control and chat.control)


# -- the route ------------------------------------------------------------------------------

async def complete(served: Served, config, body: Any, scope: str) -> Response:
    chat, values, jobs = await plan_jobs(served, config, body, control=True)
    cid, created = "chatcmpl-" + random_string(), now_s()
    alias = served.state.chat_settings().reasoning_alias
    # controllable by id while this request runs; armed only when asked for
    # (a template without thinking markers arms jobs nothing closes, as upstream)
    armed = chat.control or values.reasoning_control
    controlled = tuple(job.id for job in jobs) if armed else None
    if not chat.stream:
        served.state.control.register(cid, scope, controlled, request=request_resources())
        finished = await run_all(served, jobs)
        choices = []
        for i, fin in enumerate(finished):
            msg = final_message(chat, fin.content)
            choice = {"finish_reason": finish_reason(fin, msg), "index": i,
                      "message": message_json(msg, alias)}
            probs = final_probs(served, values, fin)
            if probs:
                choice["logprobs"] = {"content": probs}
            choices.append(choice)
        first = finished[0]
        res = {"choices": choices, "created": created, "model": served.model_name,
               "system_fingerprint": served.build_info, "object": "chat.completion",
               "usage": usage_json(first), "id": cid}
        if values.verbose:
            res["__verbose"] = final_object(served, values, first, chat.tokens, 0, False)
        res["timings"] = first.timings.to_json()
        return json_response(res)
    return await _stream(served, chat, values, jobs, cid, created, alias, scope, controlled)


def _chunk(served: Served, cid: str, created: int, choices: list) -> dict[str, Any]:
    return {"choices": choices, "created": created, "id": cid, "model": served.model_name,
            "system_fingerprint": served.build_info, "object": "chat.completion.chunk"}


async def _stream(served, chat: ChatPlan, values, jobs, cid, created, alias, scope,
                  controlled) -> Response:
    index = {job.id: i for i, job in enumerate(jobs)}
    streams = {job.id: ChatStream(chat.syntax, chat.prefill, chat.echo) for job in jobs}
    role_sent: set[int] = set()
    per_token_timings = values.timings_per_token
    probs = ProbsRenderer(served, values.post_sampling_probs)

    def chunk(i: int, delta: dict, reason=None) -> dict:
        return _chunk(served, cid, created,
                      [{"finish_reason": reason, "index": i, "delta": delta}])

    def render(ev) -> Iterable[bytes]:
        i = index[ev.job_id]
        out: list[dict] = []
        if isinstance(ev, (TokenPiece, PromptProgress)) and (
                ev.job_id not in role_sent or isinstance(ev, PromptProgress)):
            role_sent.add(ev.job_id)
            out.append(chunk(i, {"role": "assistant", "content": None}))
        if isinstance(ev, TokenPiece):
            out += [chunk(i, delta_json(d, alias)) for d in streams[ev.job_id].update(ev.text)]
            if out and ev.probs is not None and ev.probs.top:
                out[-1]["choices"][0]["logprobs"] = {"content": [probs.entry(ev.probs)]}
            if out and (per_token_timings or ev.last):
                out[-1]["timings"] = ev.timings.to_json()
        elif isinstance(ev, PromptProgress):
            if per_token_timings:
                out[-1]["timings"] = ev.timings().to_json()
            out[-1]["prompt_progress"] = ev.to_json()
        elif isinstance(ev, Finished):
            stream = streams[ev.job_id]
            out += [chunk(i, delta_json(d, alias)) for d in stream.finish()]
            out.append(chunk(i, {}, finish_reason(ev, stream.msg)))
            if chat.include_usage:
                out.append({**_chunk(served, cid, created, []), "usage": usage_json(ev)})
            out[-1]["timings"] = ev.timings.to_json()
            if values.verbose:  # upstream: on the first chunk of the final result
                out[0]["__verbose"] = final_object(served, values, ev, chat.tokens, i, True)
        return [frame(obj) for obj in out]

    return await stream_jobs(
        served, jobs, render, values.sse_ping_interval, trailer=DONE,
        opened=lambda handle: served.state.control.register(cid, scope, controlled,
                                                            handle=handle))


# -- prompt-only routes -------------------------------------------------------------------------

async def apply_template(served: Served, config, body: Any) -> Response:
    return json_response({"prompt": (await chat_plan(served, config, body, False)).prompt})


async def input_tokens(served: Served, config, body: Any,
                 convert: Callable[[Any], Any] | None = None, oai: bool = True) -> Response:
    """{"input_tokens": N} from the render and encode generation would run."""
    if convert is not None:
        body = convert(body)
    chat = await chat_plan(served, config, body, False)
    res: dict[str, Any] = {"input_tokens": len(chat.tokens)}
    if oai:
        res["object"] = "response.input_tokens"
    return json_response(res)

"""POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages API.

As upstream, the body is translated into a chat-completions body
(`to_chat_body`) and runs the chat path; only the rendering differs.
The translation follows llama-server's converter: `system` (a string or
text blocks) becomes a system message, content blocks become text parts,
`thinking` blocks reasoning_content, `tool_use` blocks tool_calls and
`tool_result` blocks tool messages; `tools` become functions,
`stop_sequences` the stop list, and `max_tokens` defaults to 4096.

The reply: content blocks (thinking, text, tool_use), stop_reason
end_turn / stop_sequence (with the matched `stop_sequence`) / tool_use /
max_tokens, and usage.  Streaming sends message_start, then for each block
content_block_start and its deltas (thinking_delta, text_delta,
input_json_delta), signature_delta before the thinking block stops, every
content_block_stop, message_delta and message_stop, each as
`event: <type>` plus `data:`.
"""

from __future__ import annotations

import json
from contextlib import aclosing
from typing import Any, AsyncIterator

from quart import Response

from ...chat.parser import ChatMsg, ChatStream
from ...protocol.records import Finished, TokenPiece
from .openai_chat import chat_plan, final_message, plan_jobs, random_string
from ..request.chat_checks import failed
from ..request.jobs import run_all
from ..request.served import Served
from ..http.errors import dumps, json_response
from .streaming import stream_jobs



def _billing_header(text: str) -> str:
    """upstream blanks the per-request cch stamp of Claude Code's billing
    header (it would defeat prefix reuse); nothing else is touched."""
    prefix = "x-anthropic-billing-header:"
    if not text.startswith(prefix):
        return text
    i = text.find("cch=", len(prefix))
    if i < 0:
        return text
    j = i + 4
    if j + 5 < len(text) and text[j + 5] == ";":
        return text[:j] + "fffff" + text[j + 5:]
    return text


def _str(obj: Any, key: str, default: str = "") -> str:
    if isinstance(obj, dict) and isinstance(obj.get(key), str):
        return obj[key]
    return default


def _image_part(source: Any) -> dict | None:
    kind = _str(source, "type")
    if kind == "base64":
        url = f"data:{_str(source, 'media_type', 'image/jpeg')};base64,{_str(source, 'data')}"
    elif kind == "url":
        url = _str(source, "url")
    else:
        return None
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_result(block: dict) -> dict:
    content = block.get("content")
    text: Any = ""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts, images = [], False
        for c in content:
            if _str(c, "type") == "text":
                parts.append({"type": "text", "text": _str(c, "text")})
            elif _str(c, "type") == "image":
                images = True
                part = _image_part(c.get("source"))
                if part:
                    parts.append(part)
        text = parts if images else "".join(p["text"] for p in parts)
    return {"role": "tool", "tool_call_id": _str(block, "tool_use_id"), "content": text}


def _messages(messages: list) -> list:
    out: list = []
    for msg in messages:
        role = _str(msg, "role")
        if not isinstance(msg, dict) or "content" not in msg:
            if role != "assistant":
                out.append(msg)
            continue
        content = msg["content"]
        if not isinstance(content, list):
            out.append(msg)
            continue
        parts, calls, results, reasoning = [], [], [], ""
        for block in content:
            kind = _str(block, "type")
            if kind == "text":
                parts.append(block)
            elif kind == "thinking":
                reasoning += _str(block, "thinking")
            elif kind == "image":
                part = _image_part(block.get("source"))
                if part:
                    parts.append(part)
            elif kind == "tool_use":
                args = block.get("input") if isinstance(block.get("input"), dict) else {}
                calls.append({"id": _str(block, "id"), "type": "function",
                              "function": {"name": _str(block, "name"),
                                           "arguments": dumps(args)}})
            elif kind == "tool_result":
                results.append(_tool_result(block))
        if parts or calls or reasoning:
            new: dict[str, Any] = {"role": role}
            if parts:
                new["content"] = parts
            else:
                new["content"] = ""
            if calls:
                new["tool_calls"] = calls
            if reasoning:
                new["reasoning_content"] = reasoning
            out.append(new)
        out += results
    return out


def to_chat_body(body: Any) -> dict:
    """server_chat_convert_anthropic_to_oai."""
    if not isinstance(body, dict):
        body = {}
    messages: list = []
    system = body.get("system")
    if isinstance(system, str):
        messages.append({"role": "system", "content": _billing_header(system)})
    elif isinstance(system, list):
        text = "".join(_billing_header(_str(b, "text")) for b in system
                       if _str(b, "type") == "text")
        messages.append({"role": "system", "content": text})
    elif system is not None:
        messages.append({"role": "system", "content": ""})
    if "messages" not in body:
        raise failed("'messages' is required")
    if isinstance(body["messages"], list):
        messages += _messages(body["messages"])
    out: dict[str, Any] = {"messages": messages}
    tools = body.get("tools")
    if isinstance(tools, list):
        out["tools"] = [{"type": "function", "function": {
            "name": _str(t, "name"), "description": _str(t, "description"),
            "parameters": t["input_schema"] if isinstance(t, dict) and "input_schema" in t
            else {}}} for t in tools]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        kind = _str(choice, "type")
        if kind == "auto":
            out["tool_choice"] = "auto"
        elif kind == "tool" and isinstance(choice.get("name"), str):
            out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        elif kind in ("any", "tool"):
            out["tool_choice"] = "required"
        if choice.get("disable_parallel_tool_use") is True:
            out["parallel_tool_calls"] = False
    if "stop_sequences" in body:
        out["stop"] = body["stop_sequences"]
    out["max_tokens"] = body["max_tokens"] if "max_tokens" in body else 4096
    # upstream's pass-through list, plus LoRA scales (upstream drops `lora`
    # here; a request naming adapters must get them on every route)
    for key in ("temperature", "top_p", "top_k", "stream", "chat_template_kwargs", "lora"):
        if key in body:
            out[key] = body[key]
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and _str(thinking, "type") == "enabled":
        budget = thinking.get("budget_tokens", 10000)
        out["thinking_budget_tokens"] = budget if isinstance(budget, int) else 10000
    elif out.get("tool_choice") not in (None, "auto"):
        # Anthropic forces a tool (any / tool) only without extended thinking:
        # the call comes at once, not after a reasoning block (a 0 budget)
        out["thinking_budget_tokens"] = 0
    return out


# -- shapes -------------------------------------------------------------------------------

def stop_reason(fin: Finished, msg: ChatMsg) -> str:
    if fin.stop_type not in ("word", "eos"):
        return "max_tokens"
    if msg.tool_calls:
        return "tool_use"
    return "stop_sequence" if fin.stop_type == "word" else "end_turn"


def _input(arguments: str) -> Any:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def content_blocks(msg: ChatMsg) -> list[dict]:
    blocks: list[dict] = []
    if msg.reasoning_content:
        blocks.append({"type": "thinking", "thinking": msg.reasoning_content, "signature": ""})
    if msg.content:
        blocks.append({"type": "text", "text": msg.content})
    for call in msg.tool_calls:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name,
                       "input": _input(call.arguments)})
    return blocks


def _usage(fin: Finished) -> dict:
    cache = fin.timings.cache_n
    return {"cache_read_input_tokens": cache, "input_tokens": fin.n_prompt - cache,
            "output_tokens": len(fin.tokens)}


def _event(kind: str, data: dict) -> bytes:
    return f"event: {kind}\ndata: ".encode() + dumps(data).encode() + b"\n\n"


# -- routes ---------------------------------------------------------------------------------

async def messages(served: Served, config, body: Any) -> Response:
    chat, values, (job,) = await plan_jobs(served, config, to_chat_body(body))
    mid = "chatcmpl-" + random_string()
    if not chat.stream:
        (fin,) = await run_all(served, [job])
        msg = final_message(chat, fin.content)
        return json_response({
            "id": mid, "type": "message", "role": "assistant", "content": content_blocks(msg),
            "model": served.model_name, "stop_reason": stop_reason(fin, msg),
            "stop_sequence": fin.stopping_word or None, "usage": _usage(fin)})
    return await stream_jobs(served, [job], _Renderer(served, chat, job, mid).render,
                             values.sse_ping_interval, wrap=_anthropic_errors)


class _Renderer:
    """Content blocks get indices in order of first appearance and stay open
    until the end, as upstream keeps them."""

    def __init__(self, served: Served, chat, job, mid: str) -> None:
        self.served, self.job, self.mid = served, job, mid
        self.stream = ChatStream(chat.syntax, chat.prefill, chat.echo)
        self.started = False
        self.blocks: dict[str, int] = {}   # "thinking" | "text" | "tool:<k>" -> index

    def _block(self, key: str, start: dict, out: list) -> int:
        if key not in self.blocks:
            self.blocks[key] = len(self.blocks)
            out.append(_event("content_block_start", {
                "type": "content_block_start", "index": self.blocks[key],
                "content_block": start}))
        return self.blocks[key]

    def _diffs(self, diffs, out: list) -> None:
        for d in diffs:
            if d.reasoning_content:
                i = self._block("thinking", {"type": "thinking", "thinking": ""}, out)
                out.append(_event("content_block_delta", {
                    "type": "content_block_delta", "index": i,
                    "delta": {"type": "thinking_delta", "thinking": d.reasoning_content}}))
            if d.content:
                i = self._block("text", {"type": "text", "text": ""}, out)
                out.append(_event("content_block_delta", {
                    "type": "content_block_delta", "index": i,
                    "delta": {"type": "text_delta", "text": d.content}}))
            if d.tool_index is not None:
                call = self.stream.msg.tool_calls[d.tool_index]
                i = self._block(f"tool:{d.tool_index}", {"type": "tool_use", "id": call.id,
                                                          "name": call.name}, out)
                if d.tool_arguments:
                    out.append(_event("content_block_delta", {
                        "type": "content_block_delta", "index": i,
                        "delta": {"type": "input_json_delta",
                                  "partial_json": d.tool_arguments}}))

    def render(self, ev) -> list[bytes]:
        out: list[bytes] = []
        if isinstance(ev, TokenPiece) and not self.started:
            self.started = True
            out.append(_event("message_start", {"type": "message_start", "message": {
                "id": self.mid, "type": "message", "role": "assistant", "content": [],
                "model": self.served.model_name, "stop_reason": None, "stop_sequence": None,
                "usage": {"cache_read_input_tokens": ev.timings.cache_n,
                          "input_tokens": len(self.job.prompt) - ev.timings.cache_n,
                          "output_tokens": 0}}}))
        if isinstance(ev, TokenPiece):
            self._diffs(self.stream.update(ev.text), out)
        elif isinstance(ev, Finished):
            self._diffs(self.stream.finish(), out)
            for key, index in sorted(self.blocks.items(), key=lambda kv: kv[1]):
                if key == "thinking":
                    out.append(_event("content_block_delta", {
                        "type": "content_block_delta", "index": index,
                        "delta": {"type": "signature_delta", "signature": ""}}))
                out.append(_event("content_block_stop", {"type": "content_block_stop",
                                                         "index": index}))
            out.append(_event("message_delta", {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason(ev, self.stream.msg),
                          "stop_sequence": ev.stopping_word or None},
                "usage": {"output_tokens": len(ev.tokens)}}))
            out.append(_event("message_stop", {"type": "message_stop"}))
        return out


async def _anthropic_errors(frames: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A failure mid-stream is `event: error` with the error object, as
    upstream frames it for this API."""
    async with aclosing(frames) as it:
        async for chunk in it:
            if chunk.startswith(b'data: {"error":'):
                err = json.loads(chunk[6:])["error"]
                chunk = b"event: error\ndata: " + dumps(err).encode() + b"\n\n"
            yield chunk


async def count_tokens(served: Served, config, body: Any) -> Response:
    chat = await chat_plan(served, config, to_chat_body(body), generating=False)
    return json_response({"input_tokens": len(chat.tokens)})

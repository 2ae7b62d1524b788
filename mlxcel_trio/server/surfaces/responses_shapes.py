"""The shapes of /v1/responses: output items, the response object, and the
stream's events (`Renderer`), shared by the route (responses.py) and the
background run (responses_background.py).
"""

from __future__ import annotations

from typing import Any, Callable

from ...chat.parser import ChatMsg, ChatStream
from ...protocol.records import Finished, PromptProgress, TokenPiece
from .openai_chat import random_string
from ..request.jobs import now_s
from ..request.served import Served
from ..http.errors import dumps


def usage(fin: Finished) -> dict:
    n = len(fin.tokens)
    return {"input_tokens": fin.n_prompt, "output_tokens": n, "total_tokens": n + fin.n_prompt,
            "input_tokens_details": {"cached_tokens": fin.timings.cache_n}}


def call_item(call, status: str = "completed") -> dict:
    return {"id": "fc_" + call.id, "type": "function_call", "status": status,
            "arguments": call.arguments, "call_id": "call_" + call.id, "name": call.name}


def text_part(text: str) -> dict:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def output_items(msg: ChatMsg) -> list[dict]:
    items: list[dict] = []
    if msg.reasoning_content:
        items.append({"id": "rs_" + random_string(), "summary": [], "type": "reasoning",
                      "content": [{"text": msg.reasoning_content, "type": "reasoning_text"}],
                      "encrypted_content": "", "status": "completed"})
    if msg.content:
        items.append({"content": [text_part(msg.content)], "id": "msg_" + random_string(),
                      "role": "assistant", "status": "completed", "type": "message"})
    items += [call_item(c) for c in msg.tool_calls]
    return items


def event(kind: str, data: dict) -> bytes:
    return f"event: {kind}\ndata: ".encode() + dumps({"type": kind, **data}).encode() + b"\n\n"


def assistant_turn(msg: ChatMsg) -> dict:
    """The reply as the chat message a continuation renders."""
    turn: dict[str, Any] = {"role": "assistant", "content": msg.content}
    if msg.reasoning_content:
        turn["reasoning_content"] = msg.reasoning_content
    if msg.tool_calls:
        turn["tool_calls"] = [{"type": "function", "id": "call_" + c.id,
                               "function": {"name": c.name, "arguments": c.arguments}}
                              for c in msg.tool_calls]
    return turn


def response_object(served: Served, rid: str, created: int, status: str, output: list,
            usage: dict | None, extra: dict) -> dict:
    obj = {"completed_at": now_s() if status == "completed" else None, "created_at": created,
           "id": rid, "model": served.model_name, "object": "response", "output": output,
           "status": status, "usage": usage, **extra}
    if obj["completed_at"] is None:
        del obj["completed_at"]
    return obj


class Renderer:
    def __init__(self, served: Served, chat, rid: str, per_token_timings: bool, created: int,
                 extra: dict, finished: Callable[[ChatMsg, dict], None]) -> None:
        self.served, self.rid = served, rid
        self.created_at, self.extra, self.finished = created, extra, finished
        self.stream = ChatStream(chat.syntax, chat.prefill, chat.echo)
        self.created = False
        self.reasoning_id = "rs_" + random_string()
        self.message_id = "msg_" + random_string()
        self.thinking_started = self.text_started = False
        self.fc_id = ""
        self.per_token_timings = per_token_timings

    def _state(self) -> dict:
        return {"response": {"id": self.rid, "object": "response", "status": "in_progress"}}

    def _diffs(self, diffs) -> list[tuple[str, dict]]:
        out: list[tuple[str, dict]] = []
        for d in diffs:
            if d.reasoning_content:
                if not self.thinking_started:
                    self.thinking_started = True
                    out.append(("response.output_item.added", {"item": {
                        "id": self.reasoning_id, "summary": [], "type": "reasoning",
                        "content": [], "encrypted_content": "", "status": "in_progress"}}))
                out.append(("response.reasoning_text.delta", {
                    "delta": d.reasoning_content, "item_id": self.reasoning_id}))
            if d.content:
                if not self.text_started:
                    self.text_started = True
                    out.append(("response.output_item.added", {"item": {
                        "content": [], "id": self.message_id, "role": "assistant",
                        "status": "in_progress", "type": "message"}}))
                    out.append(("response.content_part.added", {
                        "item_id": self.message_id, "part": {"type": "output_text", "text": ""}}))
                out.append(("response.output_text.delta", {"item_id": self.message_id,
                                                           "delta": d.content}))
            if d.tool_name:
                self.fc_id = d.tool_id
                call = self.stream.msg.tool_calls[d.tool_index]
                out.append(("response.output_item.added", {"item": {
                    "id": "fc_" + call.id, "arguments": "", "call_id": "call_" + call.id,
                    "name": call.name, "type": "function_call", "status": "in_progress"}}))
            if d.tool_arguments:
                out.append(("response.function_call_arguments.delta", {
                    "delta": d.tool_arguments, "item_id": "fc_" + self.fc_id}))
        return out

    def render(self, ev) -> list[bytes]:
        events: list[tuple[str, dict]] = []
        if isinstance(ev, (TokenPiece, PromptProgress)):
            if not self.created:
                self.created = True
                events += [("response.created", self._state()),
                           ("response.in_progress", self._state())]
            elif isinstance(ev, PromptProgress):
                events.append(("response.in_progress", self._state()))
        if isinstance(ev, TokenPiece):
            events += self._diffs(self.stream.update(ev.text))
            if events and (self.per_token_timings or ev.last):
                events[-1][1]["timings"] = ev.timings.to_json()
        elif isinstance(ev, PromptProgress):
            if self.per_token_timings:
                events[-1][1]["timings"] = ev.timings().to_json()
            events[-1][1]["prompt_progress"] = ev.to_json()
        elif isinstance(ev, Finished):
            events += self._diffs(self.stream.finish())
            events += self._done(ev)
        return [event(kind, data) for kind, data in events]

    def _done(self, fin: Finished) -> list[tuple[str, dict]]:
        msg = self.stream.msg
        out: list[tuple[str, dict]] = []
        output: list[dict] = []
        if msg.reasoning_content:
            item = {"id": self.reasoning_id, "summary": [], "type": "reasoning",
                    "content": [{"text": msg.reasoning_content, "type": "reasoning_text"}],
                    "encrypted_content": ""}
            out.append(("response.output_item.done", {"item": item}))
            output.append(item)
        if msg.content:
            part = text_part(msg.content)
            out.append(("response.output_text.done", {"item_id": self.message_id,
                                                      "text": msg.content}))
            out.append(("response.content_part.done", {"item_id": self.message_id,
                                                       "part": part}))
            item = {"type": "message", "status": "completed", "id": self.message_id,
                    "content": [part], "role": "assistant"}
            out.append(("response.output_item.done", {"item": item}))
            output.append(item)
        for call in msg.tool_calls:
            item = call_item(call)
            out.append(("response.output_item.done", {"item": item}))
            output.append(item)
        response = {
            "id": self.rid, "object": "response", "created_at": now_s(), "status": "completed",
            "model": self.served.model_name, "output": output, "usage": usage(fin),
            **self.extra}
        out.append(("response.completed", {"response": response,
                                           "timings": fin.timings.to_json()}))
        self.finished(msg, {**response, "created_at": self.created_at, "completed_at": now_s()})
        return out

"""Realtime reasoning control: a streaming chat with `reasoning_control:
true`, a POST /v1/chat/completions/control mid-thinking, and the thinking
block closes (the budget message, then </think>) with content following.
The random-weight model never closes its own block within the whole run
(checked against its greedy native continuation), so the close is the
control's doing.  Raw httpx: the control route is llama-server's own."""

from __future__ import annotations

import json

import httpx
import pytest

from .sse import iter_sse_lines, post
from .test_chat_completions import THINK

pytestmark = pytest.mark.e2e

N = 600
K1, K2 = "key-one-" + "a" * 24, "key-two-" + "b" * 24
NO_COMPLETION = {"success": False, "message": "no active completion for this id"}


@pytest.fixture(scope="module")
def srv(tiny_model, start_server):
    s = start_server(tiny_model, "-np", "2", "-c", "2048", "--reasoning-budget-message",
                     " Stop.", "--api-key", f"{K1},{K2}")
    yield s
    s.stop()


def auth(key=K1) -> dict:
    return {"headers": {"Authorization": f"Bearer {key}"}}


def control(srv, body, key=K1) -> httpx.Response:
    return post(srv.url, body, path="/v1/chat/completions/control", **auth(key))


def greedy_native(srv, n: int) -> str:
    prompt = post(srv.url, {"messages": THINK}, path="/apply-template", **auth()).json()["prompt"]
    ids = post(srv.url, {"content": prompt, "parse_special": True}, path="/tokenize",
               **auth()).json()["tokens"]
    return post(srv.url, {"prompt": ids, "n_predict": n, "temperature": 0, "ignore_eos": True},
                **auth()).json()["content"]


def stream_with(srv, body: dict, on_first) -> tuple[str, str, object]:
    """Stream a chat; call on_first(id) at the first content delta; return
    (content, id, what on_first returned)."""
    text, cid, got, called = "", "", None, False
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", srv.url + "/v1/chat/completions", json={**body, "stream": True},
                      headers=auth()["headers"]) as r:
            assert r.status_code == 200, r.read()
            for line in iter_sse_lines(r):
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                cid = chunk["id"]
                if chunk["choices"]:
                    text += chunk["choices"][0]["delta"].get("content") or ""
                if text and not called:
                    called, got = True, on_first(cid)
    return text, cid, got


BODY = {"messages": THINK, "max_tokens": N, "temperature": 0, "ignore_eos": True,
        "reasoning_format": "none"}


def test_control_mid_thinking_closes_the_block(srv):
    assert "</think>" not in greedy_native(srv, N)  # alone, the model never closes it

    def end_it(cid):
        # another key cannot see the completion; its owner ends the thinking
        assert control(srv, {"id": cid, "action": "reasoning_end"}, K2).json() == NO_COMPLETION
        return control(srv, {"id": cid, "action": "reasoning_end"})

    text, cid, answer = stream_with(srv, {**BODY, "reasoning_control": True}, end_it)
    assert answer.status_code == 200 and answer.json() == {"success": True}
    thoughts, sep, content = text.partition(" Stop.</think>")
    assert sep, f"the forced close never came: {text[-200:]!r}"
    assert thoughts and content, "the close came first or nothing followed it"
    # finished: the id matches nothing any more
    assert control(srv, {"id": cid, "action": "reasoning_end"}).json() == NO_COMPLETION


def test_reasoning_content_splits_at_the_forced_close(srv):
    body = {**BODY, "reasoning_control": True, "reasoning_format": "deepseek"}
    reasoning, content = "", ""
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", srv.url + "/v1/chat/completions", json={**body, "stream": True},
                      headers=auth()["headers"]) as r:
            sent = False
            for line in iter_sse_lines(r):
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if not chunk["choices"]:
                    continue
                delta = chunk["choices"][0]["delta"]
                reasoning += delta.get("reasoning_content") or ""
                content += delta.get("content") or ""
                if reasoning and not sent:
                    sent = True
                    assert control(srv, {"id": chunk["id"], "action": "reasoning_end"}).json() \
                        == {"success": True}
    assert reasoning.endswith("Stop.") and content


def test_an_unarmed_completion_is_not_controlled(srv):
    text, _, answer = stream_with(
        srv, BODY, lambda cid: control(srv, {"id": cid, "action": "reasoning_end"}))
    assert answer.json() == {"success": False,
                             "message": "reasoning control not enabled for this completion"}
    assert "</think>" not in text


@pytest.mark.parametrize("body, status, answer", [
    ({"action": "reasoning_end"}, 400, "missing completion id"),
    ({"id": "", "action": "reasoning_end"}, 400, "missing completion id"),
    ({"id": "chatcmpl-x"}, 400, "unknown control action"),
    ({"id": "chatcmpl-x", "action": "pause"}, 400, "unknown control action"),
    ({"id": "chatcmpl-x", "action": "reasoning_end"}, 200, NO_COMPLETION),
])
def test_control_answers(srv, body, status, answer):
    r = control(srv, body)
    assert r.status_code == status, r.text
    if status == 400:
        assert r.json() == {"error": {"code": 400, "message": answer,
                                      "type": "invalid_request_error"}}
    else:
        assert r.json() == answer


def test_control_follows_a_stream_session_past_a_disconnect(srv):
    """With X-Conversation-Id the generation outlives its request: after the
    client drops the connection the completion is still controllable, and
    the replayed stream shows the forced close."""
    headers = {**auth()["headers"], "X-Conversation-Id": "control-session-1"}
    body = {**BODY, "stream": True, "reasoning_control": True}
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", srv.url + "/v1/chat/completions", json=body,
                      headers=headers) as r:
            assert r.status_code == 200
            for line in iter_sse_lines(r):
                if line.startswith("data: {"):
                    cid = json.loads(line[6:])["id"]
                    break
    # disconnected; the session keeps generating and the id stays live
    assert control(srv, {"id": cid, "action": "reasoning_end"}).json() == {"success": True}
    replay = httpx.get(srv.url + "/v1/stream", params={"conv_id": "control-session-1",
                                                       "from": 0},
                       headers=auth()["headers"], timeout=60)
    assert replay.status_code == 200
    text = ""
    for line in replay.text.split("\n"):
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            if chunk["choices"]:
                text += chunk["choices"][0]["delta"].get("content") or ""
    assert " Stop.</think>" in text

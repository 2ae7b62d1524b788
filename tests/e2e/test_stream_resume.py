"""Streams that survive reconnects (X-Conversation-Id), end to end: real
server processes, real disconnects (the client closes its connection after K
bytes), byte-compared replays.

What the byte comparisons rest on: every resumed transcript is built from
cut-off connections only (the POST cut after K bytes, then GET /v1/stream
from each received length, each cut again), and must equal the session's own
full replay from offset 0 byte for byte; that replay must in turn be, frame
for frame, the stream an uninterrupted request without the header produces
(greedy decoding; only ids, timestamps and timings may differ).
"""

from __future__ import annotations

import json
import random
import time
import uuid

import httpx
import pytest

from tests.conftest import wait_until

from .sse import post

pytestmark = pytest.mark.e2e

HEADER = "X-Conversation-Id"
BOUND_S = 30.0          # generous bound for a generation to reach its end
N = 48                  # tokens per generation in the all-routes test
GREEDY = {"temperature": 0, "ignore_eos": True, "stream": True}
CHAT = [{"role": "user", "content": "Tell me a story about the engine."}]
PROMPT = "Once upon a time, in a land far away,"
BODIES = {
    "/completion": {"prompt": PROMPT, "n_predict": N},
    "/completions": {"prompt": PROMPT, "n_predict": N},
    "/v1/completions": {"model": "m", "prompt": PROMPT, "max_tokens": N},
    "/v1/chat/completions": {"model": "m", "messages": CHAT, "max_tokens": N},
    "/chat/completions": {"model": "m", "messages": CHAT, "max_tokens": N},
    "/v1/responses": {"model": "m", "input": "Tell me a story about the engine.",
                      "max_output_tokens": N},
    "/v1/messages": {"model": "m", "messages": CHAT, "max_tokens": N},
}
# the last frame each route sends when the generation ran to its end
TERMINAL = {"/completion": b'"stop":true', "/completions": b'"stop":true',
            "/v1/completions": b"data: [DONE]", "/v1/chat/completions": b"data: [DONE]",
            "/chat/completions": b"data: [DONE]", "/v1/responses": b"response.completed",
            "/v1/messages": b"message_stop"}
VOLATILE = {"id", "created", "created_at", "completed_at", "timings", "system_fingerprint",
            "item_id", "response_id"}


# -- clients that really disconnect -----------------------------------------------------

def post_cut(url: str, path: str, body: dict, conv: str | None, cut: int,
             headers: dict | None = None) -> tuple[bytes, bool]:
    """POST a streaming request; keep its first `cut` body bytes, then close
    the connection.  (bytes, whether the stream had ended by itself)."""
    hdrs = {**({HEADER: conv} if conv else {}), **(headers or {})}
    return _read_cut("POST", url + path, cut, json=body, headers=hdrs)


def get_cut(url: str, conv: str, frm: int, cut: float = float("inf"),
            headers: dict | None = None) -> tuple[bytes, bool]:
    return _read_cut("GET", url + "/v1/stream", cut, params={"conv_id": conv, "from": frm},
                     headers=headers)


def _read_cut(method: str, url: str, cut: float, **kw) -> tuple[bytes, bool]:
    got = b""
    with httpx.Client(timeout=60) as c, c.stream(method, url, **kw) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for chunk in r.iter_raw():
            got += chunk
            if len(got) >= cut:
                return got[:int(cut)], False   # leaving the block closes the socket
    return got, True


def lookup(url: str, *ids: str, headers: dict | None = None) -> list[dict]:
    r = httpx.post(url + "/v1/streams/lookup", json={"conversation_ids": list(ids)},
                   headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def wait_for(what: str, probe, bound: float = BOUND_S):
    return wait_until(probe, what, bound)


def slots_idle(url: str) -> bool:
    return not any(s["is_processing"] for s in httpx.get(url + "/slots", timeout=10).json())


def frames(raw: bytes) -> list:
    """The stream as (event, data) pairs with volatile fields dropped."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        event, data = None, None
        for line in block.split("\n"):
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        out.append((event, data if data == "[DONE]" else _stable(json.loads(data))))
    return out


def _stable(obj):
    if isinstance(obj, dict):
        return {k: _stable(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [_stable(v) for v in obj]
    return obj


def resume_to_end(url: str, conv: str, have: bytes, rng: random.Random,
                  lo: int = 60, hi: int = 700, headers: dict | None = None) -> tuple[bytes, int]:
    """Reconnect from len(have) with a random cut, again and again, until a
    connection sees the stream end.  (all bytes, reconnects)."""
    n = 0
    while True:
        part, ended = get_cut(url, conv, len(have), rng.randint(lo, hi), headers=headers)
        have += part
        n += 1
        if ended:
            return have, n
        assert n < 10_000


@pytest.fixture(scope="module")
def srv(tiny_model, start_server):
    s = start_server(tiny_model, "-c", "65536", "-np", "2")
    yield s
    s.stop()


# -- the tests ------------------------------------------------------------------------

@pytest.mark.parametrize("path", list(BODIES))
def test_resume_from_every_cut_rebuilds_the_uninterrupted_stream(srv, path):
    body = {**BODIES[path], **GREEDY}
    plain, ended = post_cut(srv.url, path, body, None, 1 << 30)
    assert ended and TERMINAL[path] in plain
    conv = f"conv-{uuid.uuid4()}"
    rng = random.Random(path)
    first, ended = post_cut(srv.url, path, body, conv, rng.randint(20, 200))
    assert not ended
    have, reconnects = resume_to_end(srv.url, conv, first, rng)
    full, _ = get_cut(srv.url, conv, 0)
    assert have == full                                # byte for byte
    assert reconnects >= 5, reconnects
    assert frames(full) == frames(plain)               # what an uninterrupted run sends
    assert full.rstrip().endswith(TERMINAL[path]) or TERMINAL[path] in full[-2000:]
    (info,) = lookup(srv.url, conv)
    assert info == {"conversation_id": conv, "is_done": True, "total_bytes": len(full),
                    "started_at": info["started_at"], "completed_at": info["completed_at"]}
    assert 0 < info["started_at"] <= info["completed_at"]
    # replay from any offset is the same suffix; past the end, nothing
    for k in (1, len(full) // 3, len(full) - 1, len(full), len(full) + 10):
        assert get_cut(srv.url, conv, k)[0] == full[k:]


def test_a_disconnect_does_not_cancel_the_generation(srv):
    n = 600
    body = {"prompt": PROMPT, "n_predict": n, **GREEDY}
    conv = f"live-{uuid.uuid4()}"
    first, ended = post_cut(srv.url, "/completion", body, conv, 120)
    assert not ended
    (info,) = lookup(srv.url, conv)
    assert not info["is_done"] and not slots_idle(srv.url)   # still generating, unowned
    wait_for("the generation's natural end", lambda: lookup(srv.url, conv)[0]["is_done"])
    full, _ = get_cut(srv.url, conv, 0)
    assert full.startswith(first)
    last = json.loads(full.rstrip().split(b"\n\n")[-1][6:])
    assert last["stop"] is True and last["tokens_predicted"] == n and last["stop_type"] == "limit"
    wait_for("every slot idle", lambda: slots_idle(srv.url), 5)


def test_two_readers_follow_one_live_generation(srv):
    body = {"prompt": PROMPT, "n_predict": 300, **GREEDY}
    conv = f"two-{uuid.uuid4()}"
    first, _ = post_cut(srv.url, "/completion", body, conv, 50)
    a, ended_a = get_cut(srv.url, conv, 0)
    b, ended_b = get_cut(srv.url, conv, 50)
    assert ended_a and ended_b and a[50:] == b and a.startswith(first)


def test_delete_stops_the_generation_frees_the_slot_and_is_idempotent(srv):
    body = {"prompt": PROMPT, "n_predict": -1, **GREEDY}   # would run for the whole context
    conv = f"stop-{uuid.uuid4()}"
    with httpx.Client(timeout=60) as c, c.stream("POST", srv.url + "/completion", json=body,
                                                  headers={HEADER: conv}) as r:
        it = r.iter_raw()
        got = next(it)
        assert not slots_idle(srv.url)
        d = c.delete(srv.url + "/v1/stream", params={"conv_id": conv})
        assert d.status_code == 204 and d.content == b""
        for chunk in it:        # the follower ends: no final frame, nothing hangs
            got += chunk
    assert b'"stop":true' not in got
    wait_for("every slot idle", lambda: slots_idle(srv.url), 3)
    assert lookup(srv.url, conv) == []
    r = httpx.get(srv.url + "/v1/stream", params={"conv_id": conv})
    assert r.status_code == 404
    d = httpx.delete(srv.url + "/v1/stream", params={"conv_id": conv})
    assert d.status_code == 204


def test_a_new_request_on_the_same_id_replaces_the_session(srv):
    conv = f"re-{uuid.uuid4()}"
    endless = {"prompt": PROMPT, "n_predict": -1, **GREEDY}
    post_cut(srv.url, "/completion", endless, conv, 100)
    short = {"prompt": PROMPT, "n_predict": 4, **GREEDY}
    second, ended = post_cut(srv.url, "/completion", short, conv, 1 << 30)
    assert ended and second.count(b"data: ") == 5
    assert get_cut(srv.url, conv, 0)[0] == second
    wait_for("every slot idle", lambda: slots_idle(srv.url), 3)


def test_route_errors_in_upstreams_words(srv):
    def err(r):
        return r.status_code, r.json()["error"]

    missing = (400, {"code": 400, "message": "Missing conversation id in path",
                     "type": "invalid_request_error"})
    assert err(httpx.get(srv.url + "/v1/stream")) == missing
    assert err(httpx.delete(srv.url + "/v1/stream?conv_id=")) == missing
    assert err(httpx.get(srv.url + "/v1/stream", params={"conv_id": "never"})) == (
        404, {"message": "File Not Found", "type": "not_found_error", "code": 404})
    conv = f"err-{uuid.uuid4()}"
    post_cut(srv.url, "/completion", {"prompt": PROMPT, "n_predict": 2, **GREEDY}, conv, 1 << 30)
    assert err(httpx.get(srv.url + "/v1/stream", params={"conv_id": conv, "from": "x"})) == (
        400, {"code": 400, "message": "Invalid 'from' offset", "type": "invalid_request_error"})
    r = httpx.post(srv.url + "/v1/streams/lookup", content=b"{")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert r.json()["error"]["message"].startswith("invalid body: [json.exception.parse_error")
    assert "code" not in r.json()["error"]
    for body in ({}, {"conversation_ids": "x"}, {"conversation_ids": [1, "", None]}, []):
        assert httpx.post(srv.url + "/v1/streams/lookup", json=body).json() == []
    # the header's value is checked before a session exists
    for bad in ("a b", "x" * 257, "caf\u00e9"):
        r = httpx.post(srv.url + "/completion", json={"prompt": PROMPT, "n_predict": 2, **GREEDY},
                       headers={HEADER: bad.encode("utf-8")})
        assert r.status_code == 400 and HEADER in r.json()["error"]["message"], r.text
    wait_for("every slot idle", lambda: slots_idle(srv.url), 3)


def test_without_the_header_or_without_streaming_nothing_is_kept(srv):
    conv = f"none-{uuid.uuid4()}"
    r = post(srv.url, {"prompt": PROMPT, "n_predict": 3, "temperature": 0},
             headers={HEADER: conv})
    assert r.status_code == 200 and r.json()["stop"] is True
    assert lookup(srv.url, conv) == []


def test_an_offset_below_the_front_drop_answers_400(srv):
    """4 MiB really overflows: 100 probabilities per token make each frame
    several KiB, so a few hundred tokens pass upstream's cap."""
    body = {"prompt": PROMPT, "n_predict": 2000, "n_probs": 100, **GREEDY}
    conv = f"drop-{uuid.uuid4()}"
    first, _ = post_cut(srv.url, "/completion", body, conv, 64)
    info = wait_for("the session to pass 4 MiB", lambda: [
        i for i in lookup(srv.url, conv) if i["total_bytes"] > 4 * 1024 * 1024 + 64], 120)[0]
    r = httpx.get(srv.url + "/v1/stream", params={"conv_id": conv, "from": 64})
    assert r.status_code == 400 and r.json() == {"error": {
        "code": 400, "message": "Stream offset lost, please restart",
        "type": "invalid_request_error"}}
    # the retained tail is still served
    tail, _ = get_cut(srv.url, conv, info["total_bytes"] - 10, 10)
    assert len(tail) == 10
    assert httpx.delete(srv.url + "/v1/stream", params={"conv_id": conv}).status_code == 204
    wait_for("every slot idle", lambda: slots_idle(srv.url), 3)


def test_sessions_are_scoped_to_the_key_that_made_them(tiny_model, start_server):
    s = start_server(tiny_model, "-c", "8192", "-np", "2", "--api-key", "key-a,key-b")
    try:
        a = {"Authorization": "Bearer key-a"}
        b = {"Authorization": "Bearer key-b"}
        conv = "shared-id"
        body = {"prompt": PROMPT, "n_predict": 300, **GREEDY}
        first, _ = post_cut(s.url, "/completion", body, conv, 80, headers=a)
        # key b: no such session, in every route's words for a missing one
        r = httpx.get(s.url + "/v1/stream", params={"conv_id": conv}, headers=b)
        assert r.status_code == 404 and r.json()["error"]["message"] == "File Not Found"
        assert lookup(s.url, conv, headers=b) == []
        assert httpx.delete(s.url + "/v1/stream", params={"conv_id": conv},
                            headers=b).status_code == 204
        # ...and b's own session under the same id does not replace a's
        mine, _ = post_cut(s.url, "/completion", {**body, "n_predict": 3}, conv, 1 << 30,
                           headers=b)
        assert get_cut(s.url, conv, 0, headers=b)[0] == mine
        have, _ = resume_to_end(s.url, conv, first, random.Random(1), headers=a)
        assert b'"stop":true' in have and b'"tokens_predicted":300' in have
        assert [i["total_bytes"] for i in lookup(s.url, conv, headers=a)] == [len(have)]
        assert httpx.get(s.url + "/v1/stream", params={"conv_id": conv}).status_code == 401
    finally:
        s.stop()


def test_sigterm_with_live_sessions_exits_promptly(tiny_model, start_server):
    """Sessions belong to the root nursery: shutdown stops their generations
    and ends their followers instead of waiting for them."""
    import signal
    import threading

    s = start_server(tiny_model, "-c", "65536", "-np", "2")
    endless = {"prompt": PROMPT, "n_predict": -1, **GREEDY}
    post_cut(s.url, "/completion", endless, "abandoned", 50)       # no follower left
    follower: dict = {}

    def follow():
        try:
            post_cut(s.url, "/completion", endless, "followed", 1 << 40)
        except httpx.HTTPError as exc:  # the connection is closed under it: expected
            follower["error"] = exc

    t = threading.Thread(target=follow)
    t.start()
    wait_for("the followed session", lambda: lookup(s.url, "followed"), 10)
    t0 = time.monotonic()
    s.signal(signal.SIGTERM)
    assert s.wait(20) == 0
    t.join(10)
    assert not t.is_alive() and time.monotonic() - t0 < 15

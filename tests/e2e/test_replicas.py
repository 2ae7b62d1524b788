"""Replicas sharing a session store (--session-store), end to end: two real
server processes (A and B) and a real valkey-server / redis-server
(tests/store_server.py).  A stream started on A is cut at random points and
resumed through B (and A, at random) byte for byte; DELETE and reasoning
control through B act on A's generation; stored responses are read and
continued on either replica; a killed owner's bytes stay readable; the
store's loss is refused clearly and its return picked up; and a soak over
random replicas ends with every slot free and every key expired.

TTLs are shortened for this module through the internal test variables
(streams 10 s, responses 10 s, a replica counts as gone 3 s after its last
heartbeat: short, yet several missed heartbeats on a loaded machine), so the
expiry checks finish in seconds.
"""

from __future__ import annotations

import concurrent.futures
import random
import signal
import time
import uuid

import httpx
import pytest

from tests.conftest import wait_until
from tests.store_server import StoreServer

from .sse import post
from .test_chat_completions import THINK
from .test_stream_resume import (
    BODIES,
    GREEDY,
    HEADER,
    PROMPT,
    TERMINAL,
    frames,
    get_cut,
    lookup,
    post_cut,
    slots_idle,
)

pytestmark = pytest.mark.e2e

TTL_S = 10
BOUND_S = 30.0
ENV = {"MLXCEL_INTERNAL_STREAM_TTL_S": str(TTL_S), "MLXCEL_INTERNAL_STREAM_GC_S": "1",
       "MLXCEL_INTERNAL_RESPONSE_TTL_S": str(TTL_S), "MLXCEL_INTERNAL_REPLICA_TTL_S": "3"}
FAMILIES = ["/v1/chat/completions", "/completion", "/v1/completions", "/v1/responses"]
SHORT = 16   # tokens per generation: enough frames to cut, few enough to stay fast
LENGTH = {"/completion": "n_predict", "/v1/completions": "max_tokens",
          "/v1/chat/completions": "max_tokens", "/v1/responses": "max_output_tokens",
          "/v1/messages": "max_tokens"}


def short_body(path: str, n: int = SHORT) -> dict:
    return {**BODIES[path], **GREEDY, LENGTH[path]: n}


@pytest.fixture(scope="module")
def store():
    server = StoreServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def pair(store, tiny_model, start_server):
    args = ("-c", "8192", "-np", "3", "--session-store", store.url,
            "--reasoning-budget-message", " Stop.")
    a = start_server(tiny_model, *args, env=ENV)
    b = start_server(tiny_model, *args, env=ENV)
    yield a, b
    a.stop()
    b.stop()


def resume_anywhere(urls: list[str], conv: str, have: bytes, rng: random.Random,
                    lo: int = 60, hi: int = 600) -> tuple[bytes, int]:
    """Reconnect from len(have) on a random replica with a random cut until
    one connection sees the end.  (all bytes, reconnects)."""
    n = 0
    while True:
        part, ended = get_cut(rng.choice(urls), conv, len(have), rng.randint(lo, hi))
        have += part
        n += 1
        if ended:
            return have, n
        assert n < 10_000


@pytest.mark.parametrize("path", FAMILIES)
def test_a_stream_started_on_a_resumes_through_b_byte_for_byte(pair, path):
    a, b = pair
    body = short_body(path)
    plain, ended = post_cut(a.url, path, body, None, 1 << 30)
    assert ended and TERMINAL[path] in plain
    rng = random.Random(path)
    for _ in range(5):
        conv = f"x-{uuid.uuid4()}"
        first, ended = post_cut(a.url, path, body, conv, rng.randint(20, 200))
        assert not ended
        have, n = resume_anywhere([b.url, b.url, a.url], conv, first, rng, 200, 1200)
        assert n >= 2, n
        full_b, _ = get_cut(b.url, conv, 0)
        full_a, _ = get_cut(a.url, conv, 0)
        assert have == full_b == full_a                   # byte for byte, on either replica
        assert frames(full_b) == frames(plain)            # what an uninterrupted run sends
        (info,) = lookup(b.url, conv)
        assert info["is_done"] and info["total_bytes"] == len(full_b)
        k = rng.randint(1, len(full_b))
        assert get_cut(b.url, conv, k)[0] == full_b[k:]
    wait_until(lambda: slots_idle(a.url), "every slot on A idle", 5)


def test_delete_through_b_frees_the_slot_on_a(pair):
    a, b = pair
    body = {"prompt": PROMPT, "n_predict": -1, **GREEDY}   # would run for the whole context
    conv = f"stop-{uuid.uuid4()}"
    with httpx.Client(timeout=60) as c, c.stream("POST", a.url + "/completion", json=body,
                                                  headers={HEADER: conv}) as r:
        it = r.iter_raw()
        got = next(it)
        assert not slots_idle(a.url) and lookup(b.url, conv)[0]["is_done"] is False
        d = c.delete(b.url + "/v1/stream", params={"conv_id": conv})
        assert d.status_code == 204 and d.content == b""
        t0 = time.monotonic()
        wait_until(lambda: slots_idle(a.url), "A's slot freed after DELETE through B", 2)
        freed_s = time.monotonic() - t0
        for chunk in it:        # A's follower ends: no final frame, nothing hangs
            got += chunk
    assert b'"stop":true' not in got
    assert freed_s < 1.0, freed_s
    assert lookup(a.url, conv) == [] and lookup(b.url, conv) == []
    for url in (a.url, b.url):
        assert httpx.get(url + "/v1/stream", params={"conv_id": conv}).status_code == 404


def test_a_new_request_through_b_replaces_and_stops_as_session(pair):
    a, b = pair
    conv = f"re-{uuid.uuid4()}"
    post_cut(a.url, "/completion", {"prompt": PROMPT, "n_predict": -1, **GREEDY}, conv, 100)
    second, ended = post_cut(b.url, "/completion",
                             {"prompt": PROMPT, "n_predict": 4, **GREEDY}, conv, 1 << 30)
    assert ended and second.count(b"data: ") == 5
    assert get_cut(a.url, conv, 0)[0] == second
    wait_until(lambda: slots_idle(a.url), "A's replaced generation stopped", 3)


def test_reasoning_control_through_b_reaches_as_generation(pair):
    a, b = pair
    body = {"messages": THINK, "max_tokens": 600, "temperature": 0, "ignore_eos": True,
            "reasoning_format": "none", "reasoning_control": True, "stream": True}
    import json
    text, cid, answer = "", "", None
    with httpx.Client(timeout=60) as c, c.stream("POST", a.url + "/v1/chat/completions",
                                                  json=body) as r:
        buf = b""
        for raw in r.iter_raw():
            buf += raw
            *blocks, buf = buf.split(b"\n\n")
            for block in blocks:
                if not block.startswith(b"data: {"):
                    continue
                chunk = json.loads(block[6:])
                cid = chunk["id"]
                if chunk["choices"]:
                    text += chunk["choices"][0]["delta"].get("content") or ""
                if text and answer is None:
                    answer = post(b.url, {"id": cid, "action": "reasoning_end"},
                                  path="/v1/chat/completions/control")
    assert answer is not None and answer.json() == {"success": True}
    assert " Stop.</think>" in text, text[-200:]
    no = {"success": False, "message": "no active completion for this id"}
    wait_until(lambda: post(b.url, {"id": cid, "action": "reasoning_end"},
                            path="/v1/chat/completions/control").json() == no,
               "the finished completion unknown through B", 5)


def test_stored_responses_on_every_replica(pair):
    a, b = pair
    first = post(a.url, {"model": "m", "input": "Hello there.", "max_output_tokens": 4,
                         "temperature": 0}, path="/v1/responses").json()
    got = httpx.get(f"{b.url}/v1/responses/{first['id']}", timeout=10)
    assert got.status_code == 200 and got.json() == first
    follow = post(b.url, {"model": "m", "input": "And then?", "max_output_tokens": 4,
                          "temperature": 0, "previous_response_id": first["id"]},
                  path="/v1/responses")
    assert follow.status_code == 200, follow.text
    assert follow.json()["previous_response_id"] == first["id"]
    # the continuation rendered A's turn: more input tokens than the turn alone
    alone = post(b.url, {"model": "m", "input": "And then?"},
                 path="/v1/responses/input_tokens").json()["input_tokens"]
    assert follow.json()["usage"]["input_tokens"] > alone
    missing = httpx.get(f"{b.url}/v1/responses/resp_nope", timeout=10)
    assert missing.status_code == 404
    # a background run on A: polled and cancelled through B
    bg = post(a.url, {"model": "m", "input": "Go on.", "max_output_tokens": 4000,
                      "temperature": 0, "ignore_eos": True, "background": True},
              path="/v1/responses").json()
    wait_until(lambda: httpx.get(f"{b.url}/v1/responses/{bg['id']}").json()["status"],
               "the background run in progress, seen through B", 10,
               until=lambda s: s == "in_progress")
    cancelled = httpx.post(f"{b.url}/v1/responses/{bg['id']}/cancel", timeout=10)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    wait_until(lambda: httpx.get(f"{a.url}/v1/responses/{bg['id']}").json()["status"],
               "A's background run cancelled", 5, until=lambda s: s == "cancelled")
    wait_until(lambda: slots_idle(a.url), "A's slot freed", 5)


def test_soak_random_replicas_then_everything_expires(pair, store):
    a, b = pair
    urls = [a.url, b.url]

    def one(i: int) -> None:
        rng = random.Random(i)
        path = rng.choice(["/completion", "/v1/chat/completions", "/v1/completions"])
        body = short_body(path)
        conv = f"soak-{i}-{uuid.uuid4()}"
        first, ended = post_cut(rng.choice(urls), path, body, conv, rng.randint(10, 200))
        have = first if ended else resume_anywhere(urls, conv, first, rng, 400, 2000)[0]
        assert have == get_cut(rng.choice(urls), conv, 0)[0], conv

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for f in [pool.submit(one, i) for i in range(20)]:
            f.result()
    for url in urls:
        wait_until(lambda u=url: slots_idle(u), f"every slot idle on {url}", 5)
    r = store.client()
    wait_until(lambda: [k for k in r.keys("mlxcel:*") if not k.startswith(b"mlxcel:r:")
                        and not k.startswith(b"mlxcel:c:")],
               "every session and response key expired", TTL_S * 3, until=lambda ks: not ks)
    assert all(r.pttl(k) > 0 for k in r.keys("mlxcel:*"))   # heartbeats, control: expiring


def test_the_owner_killed_mid_stream_loses_no_written_byte(pair, store, tiny_model,
                                                             start_server):
    _, b = pair
    victim = start_server(tiny_model, "-c", "8192", "-np", "1", "--session-store", store.url,
                          env=ENV)
    conv = f"kill-{uuid.uuid4()}"
    # bounded: a live replica continues it to its end (its slot, not the victim's)
    body = {"prompt": PROMPT, "n_predict": 600, **GREEDY}
    with httpx.Client(timeout=60) as c, c.stream("POST", victim.url + "/completion", json=body,
                                                  headers={HEADER: conv}) as r:
        got = b""
        for chunk in r.iter_raw():
            got += chunk
            if len(got) > 2000:
                victim.signal(signal.SIGKILL)
                break
    victim.wait(10)
    # every byte the client got is in the store; a live replica continues the
    # generation (tests/e2e/test_takeover.py compares it), then B says it ended
    info = wait_until(lambda: lookup(b.url, conv), "B reports the killed owner's session ended",
                      BOUND_S, until=lambda found: found and found[0]["is_done"])
    full, ended = get_cut(b.url, conv, 0)
    assert ended and full.startswith(got) and info[0]["total_bytes"] == len(full)


def test_losing_the_store_refuses_resumable_streams_only_and_recovers(pair, store, tiny_model,
                                                                      start_server):
    a, b = pair
    live = {"prompt": PROMPT, "n_predict": 48, **GREEDY}
    with httpx.Client(timeout=60) as c, c.stream("POST", a.url + "/completion", json=live,
                                                  headers={HEADER: f"mid-{uuid.uuid4()}"}) as r:
        it = r.iter_raw()
        got = next(it)
        store.stop()                                         # mid-stream
        for chunk in it:
            got += chunk
    assert got.rstrip().endswith(b"}") and b'"stop":true' in got   # its client got every byte
    try:
        body = {"prompt": PROMPT, "n_predict": 4, **GREEDY}
        r = post(a.url, body, headers={HEADER: f"down-{uuid.uuid4()}"})
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["type"] == "unavailable_error" and "session store" in err["message"]
        assert f"127.0.0.1:{store.port}" in err["message"]
        assert post(a.url, body).status_code == 200          # without the header: unaffected
        assert post(b.url, {"prompt": PROMPT, "n_predict": 2}).json()["stop"] is True
        # a replica started while the store is unreachable starts, degraded, and says so
        late = start_server(tiny_model, "-c", "4096", "-np", "1", "--session-store", store.url,
                            env=ENV)
        late.wait_for_text("unreachable at startup", 10)
        assert post(late.url, body, headers={HEADER: "x"}).status_code == 503
    finally:
        store.start()                                         # same port, empty
    for s in (a, late):
        conv = f"back-{uuid.uuid4()}"

        def resumable(url: str = s.url, conv: str = conv) -> int:
            return post(url, {"prompt": PROMPT, "n_predict": 4, **GREEDY},
                        headers={HEADER: conv}).status_code
        wait_until(resumable, "a resumable stream accepted once the store is back", 15,
                   until=lambda status: status == 200)
        # B notices the store's return by itself too (its backoff is at most 5 s)
        wait_until(lambda c=conv: httpx.get(b.url + "/v1/stream", params={"conv_id": c},
                                            timeout=10).status_code,
                   "B reading the store again", 15, until=lambda status: status == 200)
        full, ended = get_cut(b.url, conv, 0)
        assert ended and full.count(b"data: ") == 5
    for s in (a, b, late):
        assert s.proc.poll() is None
    late.stop()

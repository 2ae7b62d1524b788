"""Client disconnects free their slot at once, on every path, and nothing else
is disturbed.  Real sockets, real server processes.

Each test runs with slots whose context is far larger than the test could
ever wait for (tens of thousands of tokens with `ignore_eos`), so a job that
was NOT cancelled would keep its slot busy long past every bound used here.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from tests.conftest import wait_until

from .sse import post

pytestmark = pytest.mark.e2e

FREE_BOUND_S = 3.0   # generous: the engine frees a slot before its next step
ENDLESS = {"n_predict": -1, "temperature": 0, "ignore_eos": True}


def slots(url: str) -> list[dict]:
    return httpx.get(url + "/slots", timeout=10).json()


def wait_slots(url: str, predicate, bound: float, what: str) -> float:
    """Bounded wait on /slots; returns the seconds it took or fails loudly."""
    t0 = time.monotonic()
    # a short pause: the seconds returned measure how fast a slot is freed
    wait_until(lambda: slots(url), what, bound, until=predicate, pause=0.005)
    return time.monotonic() - t0


def busy(state) -> bool:
    return any(s["is_processing"] for s in state)


def idle(state) -> bool:
    return not busy(state)


def raw_post(port: int, body: dict) -> socket.socket:
    """Send a request on a raw socket and return it unread."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /completion HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(data) + data)
    return s


@pytest.fixture(scope="module")
def one_slot(tiny_model, start_server):
    srv = start_server(tiny_model, "-np", "1", "-c", "131072", "-b", "16")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def two_slots(tiny_model, start_server):
    srv = start_server(tiny_model, "-np", "2", "-c", "131072")
    yield srv
    srv.stop()


def test_stream_disconnect_frees_slot_while_other_stream_continues(two_slots, tiny_facts):
    url = two_slots.url
    other_body = {"prompt": tiny_facts["long_prompt"], "n_predict": 1200, "temperature": 0,
                  "ignore_eos": True}
    solo = post(url, other_body).json()["content"]
    result: dict = {}
    reading = threading.Event()

    def other():
        pieces = []
        with httpx.stream("POST", url + "/completion", json={**other_body, "stream": True},
                          timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    frame = json.loads(line[6:])
                    pieces.append(frame["content"])
                    reading.set()
        result["content"] = "".join(pieces)

    t = threading.Thread(target=other)
    t.start()
    assert reading.wait(30), "the other stream never started"
    with httpx.stream("POST", url + "/completion", json={"prompt": "A", "stream": True, **ENDLESS},
                      timeout=30) as r:
        lines = r.iter_lines()  # keep the iterator alive: dropping it closes the stream
        for _ in range(10):
            next(lines)
        assert sum(s["is_processing"] for s in slots(url)) == 2
    # the endless job's slot frees; the other keeps running to its end
    wait_slots(url, lambda st: sum(s["is_processing"] for s in st) <= 1, FREE_BOUND_S,
               "the disconnected stream's slot freed")
    t.join(60)
    assert result["content"] == solo
    wait_slots(url, idle, FREE_BOUND_S, "all slots idle")


def test_non_streaming_disconnect_while_generating(one_slot):
    s = raw_post(one_slot.port, {"prompt": "B", **ENDLESS})
    wait_slots(one_slot.url, busy, 10, "the request started")
    s.close()
    wait_slots(one_slot.url, idle, FREE_BOUND_S, "slot freed after a non-streaming disconnect")


def test_disconnect_while_queued_never_runs(one_slot):
    url = one_slot.url
    holder = raw_post(one_slot.port, {"prompt": "C", **ENDLESS})
    wait_slots(url, busy, 10, "the holder started")
    queued = raw_post(one_slot.port, {"prompt": "D", **ENDLESS})
    # the queued request is accepted by the server before we drop it: a
    # /health round trip on the same server orders after its headers
    assert httpx.get(url + "/health").status_code == 200
    queued.close()
    holder.close()
    # had the queued job survived, it would now hold the slot for ~65k tokens
    wait_slots(url, idle, FREE_BOUND_S, "slot idle after both disconnected")
    state = slots(url)
    assert idle(state), state


def test_disconnect_during_prefill(one_slot):
    """-b 16 makes a 20k-token prompt take ~1250 prefill chunks; the stream is
    dropped after the first progress frame, long before prefill could end."""
    url = one_slot.url
    prompt = [7] * 20000
    t0 = time.monotonic()
    with httpx.stream("POST", url + "/completion",
                      json={"prompt": prompt, "stream": True, "return_progress": True, **ENDLESS},
                      timeout=30) as r:
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: "):
                frame = json.loads(line[6:])
                assert "prompt_progress" in frame
                assert frame["prompt_progress"]["processed"] < frame["prompt_progress"]["total"]
                break
        assert busy(slots(url))
    took = wait_slots(url, idle, FREE_BOUND_S, "slot freed during prefill")
    assert time.monotonic() - t0 < 10, took


def test_cancelled_jobs_leave_the_server_serving(one_slot, tiny_facts):
    res = post(one_slot.url, {"prompt": tiny_facts["long_prompt"], "n_predict": 16,
                              "temperature": 0, "return_tokens": True}).json()
    assert res["tokens"] == tiny_facts["long_greedy_ids"][:16]

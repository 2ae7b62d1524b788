"""A client that shuts its sending side after a complete request
(`shutdown(SHUT_WR)`) and waits for the answer is answered as llama-server
answers it (server/http/half_close.py): on an engine route the job is
cancelled and the answer is an empty 200 (a stream: its head alone);
another route answers in full.
Raw sockets, a real server process."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.conftest import wait_until

pytestmark = pytest.mark.e2e

READ_S = 30.0   # bound on reading an answer to its end


@pytest.fixture(scope="module")
def endless(tiny_model, start_server):
    """One slot with a context no test here could see the end of."""
    srv = start_server(tiny_model, "-np", "1", "-c", "65536")
    yield srv
    srv.stop()


def half_closed(port: int, method: str, path: str, body: dict | None = None) -> bytes:
    """Send one request, shut the sending side, read until the server
    closes; everything it sent."""
    data = b"" if body is None else json.dumps(body).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: t\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=READ_S) as s:
        s.sendall(head.encode() + b"\r\n" + data)
        s.shutdown(socket.SHUT_WR)
        got = b""
        deadline = time.monotonic() + READ_S
        while time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                return got
            got += chunk
    raise AssertionError(f"the server neither answered to the end nor closed in {READ_S} s: "
                         f"{got[:300]!r}")


def parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    assert raw, "no answer at all: the connection was closed without one"
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
    return int(status_line.split()[1]), headers, body


def test_an_engine_route_cancels_the_job_and_answers_an_empty_200(endless):
    raw = half_closed(endless.port, "POST", "/completion",
                      {"prompt": "A", "n_predict": -1, "temperature": 0, "ignore_eos": True})
    status, headers, body = parse(raw)
    assert (status, headers.get("content-length"), body) == (200, "0", b""), raw
    assert headers.get("content-type") == "application/json; charset=utf-8"
    assert headers.get("server") == "llama.cpp"
    # the job was cancelled: the slot is free long before the endless job could end
    wait_until(lambda: httpx.get(endless.url + "/slots", timeout=10).json(),
               "the half-closed client's slot freed", 10,
               until=lambda slots: not any(s["is_processing"] for s in slots))


def test_a_stream_stops_after_its_head(endless):
    """Upstream's stream looks at the connection before its first frame.  The
    end of input races the head: when the head went out first, the frames
    sent until the end of input was seen come too, and the stream is then
    cancelled; either way an endless stream ends without its last frame."""
    raw = half_closed(endless.port, "POST", "/completion",
                      {"prompt": "A", "n_predict": -1, "temperature": 0, "ignore_eos": True,
                       "stream": True})
    status, headers, body = parse(raw)
    assert (status, headers.get("content-type")) == (200, "text/event-stream"), raw
    # half_closed() returned, so the server closed the endless stream
    assert b'"stop":true' not in body and b"[DONE]" not in body, raw
    wait_until(lambda: httpx.get(endless.url + "/slots", timeout=10).json(),
               "the half-closed stream's slot freed", 10,
               until=lambda slots: not any(s["is_processing"] for s in slots))


def test_another_route_answers_in_full(endless):
    # long enough to tokenize that the end of input arrives while it runs
    text = "hello world, " * 200_000
    raw = half_closed(endless.port, "POST", "/tokenize", {"content": text})
    status, headers, body = parse(raw)
    assert status == 200, raw[:300]
    assert len(body) == int(headers["content-length"])
    assert len(json.loads(body)["tokens"]) > 200_000
    status, _, body = parse(half_closed(endless.port, "GET", "/health"))
    assert (status, json.loads(body)) == (200, {"status": "ok"})

"""Hostile input against a real server: every bad request gets a clear 4xx
envelope while a concurrent well-behaved stream completes unaffected, and
hundreds of idle or slow connections do not keep a normal request waiting.

Limits exercised: the body size (413 from Content-Length, before a byte is
read or parsed), nesting depth, invalid UTF-8, huge n_predict, huge stop
lists / logit_bias / response_fields (server/http/limits.py), header size
(431), slow clients (the request head must arrive within the 5 s keep-alive
window, the body within --timeout: test_transport.py)."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .sse import post, stream_frames

pytestmark = pytest.mark.e2e

ROUTES = ["/completion", "/completions", "/v1/completions", "/infill", "/tokenize",
          "/detokenize"]
STREAM = {"prompt": "def main():\n    ", "n_predict": 48, "temperature": 0,
          "ignore_eos": True, "stream": True}


def check_envelope(r: httpx.Response) -> None:
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        err = r.json()["error"]
        assert err["code"] == r.status_code and err["type"] and err["message"], err


def addr(server) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


@pytest.mark.parametrize(("raw", "status", "needle"), [
    (b"[" * 5000 + b"]" * 5000, 400, "more than 128 levels deep"),
    (b'{"prompt": "x", "response_fields": ' + b"[" * 300 + b"]" * 300 + b"}", 400, "levels deep"),
    (b'{"prompt": "\xff\xfe", "n_predict": 1}', 400, "ill-formed UTF-8"),
    (json.dumps({"prompt": "x", "n_predict": 3 * 10**9}).encode(), 400, "Field 'n_predict'"),
    (json.dumps({"prompt": "x", "stop": ["s"] * 100_000}).encode(), 400, "Field 'stop'"),
    (json.dumps({"prompt": "x", "logit_bias": {str(i): 1 for i in range(300_000)}}).encode(),
     400, "Field 'logit_bias'"),
    (json.dumps({"prompt": "x", "response_fields": ["a"] * 5000}).encode(), 400,
     "Field 'response_fields'"),
])
def test_each_hostile_body_is_a_clear_4xx(server, raw, status, needle):
    r = post(server.url, raw)
    assert r.status_code == status and needle in r.json()["error"]["message"], r.text
    check_envelope(r)


def test_an_oversized_body_is_413_before_it_is_sent(server):
    with socket.create_connection(addr(server), timeout=10) as s:
        s.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000000000\r\n\r\n{")
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower()
    assert json.loads(body) == {"error": {"code": 413, "type": "invalid_request_error",
                                          "message": "Request body too large: the limit is "
                                                     "67108864 bytes"}}


def test_a_media_route_is_held_to_the_image_budgets_ceiling(server):
    """Chat, responses and messages bodies may carry base64 images: their
    ceiling is --max-image-payload-size * --max-images * 4/3 + 1 MiB (the
    defaults: 20 MiB * 16), not the general 64 MiB; past it, the same 413."""
    derived = -(-20 * 1024 * 1024 * 16 * 4 // 3) + 1024 * 1024
    for path in ("/v1/chat/completions", "/v1/responses", "/v1/messages"):
        with socket.create_connection(addr(server), timeout=10) as s:
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {derived + 1}\r\n\r\n{{".encode())
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413"), (path, head)
        assert json.loads(body)["error"] == {
            "code": 413, "type": "invalid_request_error",
            "message": f"Request body too large: the limit is {derived} bytes"}


def test_oversized_headers_are_431_and_the_server_goes_on(server):
    r = httpx.get(server.url + "/health", headers={"X-Big": "a" * 40_000}, timeout=10)
    assert r.status_code == 431 and r.json()["error"]["code"] == 431
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


bodies = st.one_of(
    st.binary(max_size=64),
    st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                           st.floats(allow_nan=False), st.text(max_size=6)),
                 lambda kids: st.one_of(st.lists(kids, max_size=4),
                                        st.dictionaries(st.sampled_from(
                                            ["prompt", "n_predict", "stop", "logit_bias",
                                             "response_fields", "input_prefix", "input_suffix",
                                             "content", "tokens", "max_tokens", "stream"]),
                                            kids, max_size=5)),
                 max_leaves=12).map(lambda v: json.dumps(v).encode()),
    st.integers(1, 400).map(lambda n: b"[" * n + b"]" * n),
)


def test_fuzz_while_a_stream_runs(server):
    solo, _ = stream_frames(server.url, STREAM)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(
        frames=stream_frames(server.url, STREAM)[0]), daemon=True)
    thread.start()
    with httpx.Client(base_url=server.url, timeout=60) as client:

        @settings(max_examples=80, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(st.sampled_from(ROUTES), bodies)
        def fuzz(path, raw):
            r = client.post(path, content=raw, headers={"Content-Type": "application/json"})
            check_envelope(r)

        fuzz()
    thread.join(60)
    assert not thread.is_alive(), "the concurrent stream did not finish within 60 s"
    content = lambda frames: "".join(f["content"] for f in frames)  # noqa: E731
    assert content(result["frames"]) == content(solo) and result["frames"][-1]["stop"]
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_hundreds_of_idle_and_slow_connections(server):
    def timed(fn) -> float:
        start = time.monotonic()
        fn()
        return time.monotonic() - start

    normal = lambda: post(server.url, {"prompt": "x", "n_predict": 4}).raise_for_status()  # noqa
    usual = max(timed(normal) for _ in range(3))
    conns = []
    try:
        for i in range(400):
            s = socket.create_connection(addr(server), timeout=10)
            if i % 2:  # slow: a request head that never completes
                s.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Le")
            conns.append(s)
        loaded = max(timed(normal) for _ in range(3))
        assert loaded < max(5 * usual, 1.0), (usual, loaded)
        # the held connections are closed by the server once the keep-alive
        # window (5 s) passes without a complete request head
        deadline = time.monotonic() + 15
        for s in conns:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                assert s.recv(1024) == b""
            except ConnectionResetError:
                pass
    finally:
        for s in conns:
            s.close()
    assert timed(normal) < max(5 * usual, 1.0)

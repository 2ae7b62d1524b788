"""Startup and shutdown of the real process: readiness, signals, bounded exit."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from mlxcel_trio.server.runner import GRACE_S, KEEP_ALIVE_S
from tests.conftest import wait_until

pytestmark = pytest.mark.e2e

EXIT_BOUND_S = 15  # hypercorn's grace (5 s) + the engine's own, with margin


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_on_idle_server_exits_zero(tiny_model, start_server, signum):
    srv = start_server(tiny_model, "-np", "1")
    assert httpx.get(srv.url + "/health").json() == {"status": "ok"}
    srv.signal(signum)
    assert srv.wait(EXIT_BOUND_S) == 0
    assert not any("Traceback" in line for line in srv.stdout + srv.stderr), \
        "".join(srv.stdout + srv.stderr)


def test_sigterm_with_a_stream_in_flight_exits_in_bounded_time(tiny_model, start_server):
    srv = start_server(tiny_model, "-np", "1", "-c", "131072")
    started = threading.Event()
    ended: dict = {}
    lines: list[str] = []
    kept = httpx.Client(base_url=srv.url, timeout=10)  # a connection open before the signal
    assert kept.get("/health").status_code == 200

    def reader():
        try:
            with httpx.stream("POST", srv.url + "/completion",
                              json={"prompt": "x", "n_predict": -1, "ignore_eos": True,
                                    "stream": True}, timeout=60) as r:
                for line in r.iter_lines():
                    lines.append(line)
                    started.set()
        except httpx.HTTPError as exc:
            ended["error"] = exc
        ended["done"] = True

    t = threading.Thread(target=reader)
    t.start()
    assert started.wait(30), "the stream never started"
    srv.signal(signal.SIGTERM)
    srv.wait_for_text("received SIGTERM, shutting down", 10)
    # a request on a connection that was already open is refused while draining
    try:
        late = kept.get("/props")
        assert late.status_code == 503, late.text
        assert late.json()["error"]["message"] == "the server is shutting down"
    except httpx.TransportError:
        pass  # the server closed the idle connection first: nothing was served either
    kept.close()
    assert srv.wait(EXIT_BOUND_S) == 0
    t.join(10)
    assert ended.get("done"), "the client was left hanging after the server exited"
    # the stream cut after the grace ends with a final error frame, not a bare cut
    data = [ln for ln in lines if ln.startswith("data: ")]
    last = json.loads(data[-1][6:])
    assert last["error"]["message"] == "the server is shutting down", data[-3:]
    assert last["error"]["type"] == "unavailable_error" and "error" not in ended, ended


def test_sigterm_with_an_idle_keep_alive_client_exits_promptly(tiny_model, start_server):
    """A kept-alive connection waiting for its next request is closed at
    once on SIGTERM; it does not hold the exit for the grace (GRACE_S),
    which is for requests in flight."""
    srv = start_server(tiny_model, "-np", "1")
    kept = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _response(kept).startswith(b"HTTP/1.1 200")
    start = time.monotonic()
    srv.signal(signal.SIGTERM)
    assert srv.wait(EXIT_BOUND_S) == 0
    took = time.monotonic() - start
    assert took < GRACE_S / 2, f"the exit waited {took:.2f} s for an idle connection"
    kept.settimeout(5)
    assert kept.recv(1024) == b"", "the idle connection was not closed"
    kept.close()


@pytest.mark.slow
def test_a_kept_alive_connection_closes_after_the_keep_alive(server):
    """After a response, a connection that sends nothing more is closed once
    the keep-alive (KEEP_ALIVE_S, upstream's 5 s) has passed, not at
    --timeout."""
    kept = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _response(kept).startswith(b"HTTP/1.1 200")
        start = time.monotonic()
        kept.settimeout(KEEP_ALIVE_S + 10)
        try:
            assert kept.recv(1024) == b""
        except TimeoutError:
            pytest.fail(f"still open {time.monotonic() - start:.1f} s after the response")
        assert time.monotonic() - start >= KEEP_ALIVE_S - 1  # not before the keep-alive
    finally:
        kept.close()


def _response(sock: socket.socket) -> bytes:
    """One small response read whole: its head, then Content-Length bytes."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, data
        body += chunk
    return head


def test_signal_during_model_load_is_graceful(tiny_model, start_server):
    srv = start_server(tiny_model, wait_ready=False)
    # the listener is announced while the engine thread is still loading
    srv.wait_for_line("main: server is listening")
    srv.signal(signal.SIGINT)
    assert srv.wait(EXIT_BOUND_S) == 0
    assert not any("Traceback" in line for line in srv.stdout + srv.stderr), \
        "".join(srv.stdout + srv.stderr)


def test_sigterm_lets_a_short_request_in_flight_finish(tiny_model, start_server):
    """Within the grace period an in-flight request completes normally, and
    no new connection is accepted meanwhile."""
    srv = start_server(tiny_model, "-np", "1", "-c", "8192")
    result: dict = {}

    def request():
        try:
            result["r"] = httpx.post(srv.url + "/completion",
                                     json={"prompt": "x", "n_predict": 300, "ignore_eos": True},
                                     timeout=60)
        except httpx.HTTPError as exc:
            result["error"] = exc

    t = threading.Thread(target=request)
    t.start()
    wait_until(lambda: httpx.get(srv.url + "/slots", timeout=10).json(), "the request to start",
               30, until=lambda slots: any(s["is_processing"] for s in slots))
    srv.signal(signal.SIGTERM)
    srv.wait_for_text("received SIGTERM, shutting down", 10)  # the signal handler's log line
    refused = None
    if t.is_alive():  # still generating: the listener must be closed already
        try:
            httpx.get(srv.url + "/health", timeout=5)
            refused = False
        except httpx.ConnectError:
            refused = True
    assert srv.wait(EXIT_BOUND_S) == 0
    t.join(10)
    assert "error" not in result, result.get("error")
    assert result["r"].status_code == 200
    assert result["r"].json()["tokens_predicted"] == 300
    assert refused is not False, "a new connection was accepted during the grace period"


def test_an_unsupported_architecture_is_one_line_before_listening(tiny_model, tmp_path):
    """mlx-lm cannot build it: one error line naming the architecture and
    what is supported, exit 1, before the socket listens; no traceback."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for f in Path(tiny_model).iterdir():
        (ckpt / f.name).symlink_to(f)
    config = json.loads((Path(tiny_model) / "config.json").read_text())
    (ckpt / "config.json").unlink()
    (ckpt / "config.json").write_text(json.dumps({**config, "model_type": "zorblax"}))
    proc = subprocess.run([sys.executable, "-m", "mlxcel_trio", "-m", str(ckpt), "--port", "0"],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "unsupported model architecture 'zorblax'" in lines[0] and "qwen3" in lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "listening" not in proc.stdout

"""Startup and shutdown of the real process: readiness, signals, bounded exit."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

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

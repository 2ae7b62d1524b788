"""Startup and shutdown of the real process: readiness, signals, bounded exit."""

from __future__ import annotations

import signal
import threading

import httpx
import pytest

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

    def reader():
        try:
            with httpx.stream("POST", srv.url + "/completion",
                              json={"prompt": "x", "n_predict": -1, "ignore_eos": True,
                                    "stream": True}, timeout=60) as r:
                for _ in r.iter_lines():
                    started.set()
        except httpx.HTTPError as exc:
            ended["error"] = exc
        ended["done"] = True

    t = threading.Thread(target=reader)
    t.start()
    assert started.wait(30), "the stream never started"
    srv.signal(signal.SIGTERM)
    assert srv.wait(EXIT_BOUND_S) == 0
    t.join(10)
    assert ended.get("done"), "the client was left hanging after the server exited"


def test_signal_during_model_load_is_graceful(tiny_model, start_server):
    srv = start_server(tiny_model, wait_ready=False)
    # the listener is announced while the engine thread is still loading
    srv.wait_for_line("main: server is listening")
    srv.signal(signal.SIGINT)
    assert srv.wait(EXIT_BOUND_S) == 0
    assert not any("Traceback" in line for line in srv.stdout + srv.stderr), \
        "".join(srv.stdout + srv.stderr)

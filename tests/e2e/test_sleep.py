"""--sleep-idle-seconds: the engine drops the model after the idle window,
the read-only routes answer without waking it, and the next generation
wakes it and is served."""

from __future__ import annotations

import signal
import time

import httpx
import pytest

from tests.conftest import wait_until

from .sse import complete, post
from .test_slots_metrics import scrape

pytestmark = pytest.mark.e2e

WINDOW_S = 1
GREEDY = {"prompt": "the quick brown fox", "n_predict": 8, "temperature": 0,
          "ignore_eos": True}


def sleeping(srv) -> bool:
    return httpx.get(srv.url + "/props", timeout=30).json()["is_sleeping"]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@pytest.fixture(scope="module")
def sleepy(tiny_model, start_server):
    return start_server(tiny_model, "-np", "2", "-c", "16384", "--metrics",
                        "--sleep-idle-seconds", str(WINDOW_S))


def test_sleeps_after_the_window_and_wakes_for_the_next_request(sleepy):
    srv = sleepy
    awake = complete(srv, **GREEDY)
    t_idle = time.monotonic()
    scrape(srv)  # the first scrape empties the throughput windows, as upstream's test does
    _, awake_text, _ = scrape(srv)
    wait_until(lambda: sleeping(srv), "the server to fall asleep", timeout=30)
    asleep_after = time.monotonic() - t_idle
    assert asleep_after >= WINDOW_S * 0.9
    # asleep, /metrics answers from the moment sleep began: the whole text equals
    # the last scrape awake (upstream's test_server_sleep_read_only_endpoints)
    metrics, asleep_text, _ = scrape(srv)
    assert asleep_text == awake_text
    assert "mlxcel_sleeping" not in metrics and metrics["mlxcel_sleeps_total"] == 0
    # what the weights free is measured on a real checkpoint (bench/sleep_wake.py)
    # and proven at the engine level (tests/unit/engine/test_sleep.py)
    assert "mlxcel_sleep_released_bytes" in metrics

    # upstream answers these four without waking (its sleep bypass)
    assert httpx.get(srv.url + "/health").json() == {"status": "ok"}
    assert httpx.get(srv.url + "/v1/models").status_code == 200
    assert sleeping(srv), "a read-only route woke the server"
    assert scrape(srv)[0]["mlxcel_wakes_total"] == 0

    t0 = time.monotonic()
    woken = complete(srv, **GREEDY)
    wake_latency = time.monotonic() - t0
    assert woken["content"] == awake["content"], "the reloaded model answers differently"
    assert not sleeping(srv)
    metrics, _, _ = scrape(srv)
    assert metrics["mlxcel_wakes_total"] == 1 and metrics["mlxcel_sleeps_total"] == 1
    print(f"\nsleep after {asleep_after:.2f} s (window {WINDOW_S} s); "
          f"wake request {wake_latency * 1e3:.0f} ms; "
          f"reload {metrics['mlxcel_wake_load_seconds_total'] * 1e3:.0f} ms; "
          f"released {metrics['mlxcel_sleep_released_bytes'] / 2**20:.2f} MiB; "
          f"VmRSS now {rss_kib(srv.proc.pid)} KiB")


# every route upstream serves without its sleep bypass: it waits for the
# model to reload before it answers (routes.py `wakes`)
WAKING = [("POST", "/tokenize", {"content": "hello"}),
          ("POST", "/detokenize", {"tokens": [1, 2]}),
          ("POST", "/apply-template", {"messages": [{"role": "user", "content": "hi"}]}),
          ("GET", "/slots", None),
          ("GET", "/lora-adapters", None),
          ("POST", "/v1/messages/count_tokens",
           {"model": "m", "messages": [{"role": "user", "content": "hi"}]})]


def test_routes_that_read_the_model_wake_it_as_upstream(sleepy):
    srv = sleepy
    for method, path, body in WAKING:
        wait_until(lambda: sleeping(srv), f"asleep before {path}", timeout=30)
        wakes = scrape(srv)[0]["mlxcel_wakes_total"]
        r = httpx.request(method, srv.url + path, json=body, timeout=60)
        assert r.status_code == 200, (path, r.text)
        # answered once the model is back, as upstream's test_server_sleep_metrics_buckets
        # finds it after its /tokenize
        assert not sleeping(srv), f"{path} answered with the server still asleep"
        assert scrape(srv)[0]["mlxcel_wakes_total"] == wakes + 1, path


def test_a_wake_by_tokenize_reports_no_throughput_again(sleepy):
    """Upstream's test_server_sleep_metrics_buckets: the first scrape asleep
    reports the last generation's throughput, the next an empty window, and
    a wake (here by /tokenize) does not report it again."""
    srv = sleepy
    complete(srv, **GREEDY)
    wait_until(lambda: sleeping(srv), "the server to fall asleep", timeout=30)
    assert scrape(srv)[0]["llamacpp:predicted_tokens_seconds"] > 0
    assert scrape(srv)[0]["llamacpp:predicted_tokens_seconds"] == 0
    assert sleeping(srv)
    assert post(srv.url, {"content": "Hello"}, path="/tokenize").status_code == 200
    assert not sleeping(srv)
    assert scrape(srv)[0]["llamacpp:predicted_tokens_seconds"] == 0


def test_a_generation_longer_than_the_window_is_never_cut(sleepy):
    srv = sleepy
    wait_until(lambda: sleeping(srv), "the server to fall asleep", timeout=30)
    n = 2000  # several windows' worth of decoding on the tiny model
    res = complete(srv, prompt="x", n_predict=n, ignore_eos=True, temperature=0)
    assert res["tokens_predicted"] == n
    assert res["timings"]["predicted_ms"] > 0
    wait_until(lambda: sleeping(srv), "the server to fall asleep again", timeout=30)


def test_concurrent_requests_wake_it_once_and_all_are_served(sleepy):
    srv = sleepy
    wait_until(lambda: sleeping(srv), "the server to fall asleep", timeout=30)
    wakes = scrape(srv)[0]["mlxcel_wakes_total"]
    import concurrent.futures as cf
    with cf.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: post(srv.url, {**GREEDY, "prompt": f"p{i}"}),
                                range(4)))
    assert [r.status_code for r in results] == [200] * 4
    assert scrape(srv)[0]["mlxcel_wakes_total"] == wakes + 1


def test_sigterm_while_asleep_exits_zero(tiny_model, start_server):
    srv = start_server(tiny_model, "-np", "1", "--sleep-idle-seconds", "0")
    wait_until(lambda: sleeping(srv), "the server to fall asleep", timeout=30)
    srv.signal(signal.SIGTERM)
    assert srv.wait(15) == 0


def test_a_slot_action_while_asleep_wakes_and_is_answered(tiny_model, start_server, tmp_path):
    """Slot files need the scheduler, so a slot action wakes the engine (the
    slot's stream was dropped with it: a save finds it empty, as upstream's
    does after its context is destroyed)."""
    srv = start_server(tiny_model, "-np", "1", "--metrics", "--sleep-idle-seconds", "1",
                       "--slot-save-path", str(tmp_path))
    complete(srv, **GREEDY)
    wait_until(lambda: sleeping(srv), "the server to fall asleep", timeout=30)
    r = httpx.post(srv.url + "/slots/0?action=save", json={"filename": "s.slot"}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["n_saved"] == 0
    assert scrape(srv)[0]["mlxcel_wakes_total"] == 1
    # a restore re-evaluates into a live scheduler, then generation still works
    r = httpx.post(srv.url + "/slots/0?action=restore", json={"filename": "s.slot"}, timeout=60)
    assert r.status_code == 200, r.text
    assert complete(srv, **GREEDY)["tokens_predicted"] == GREEDY["n_predict"]

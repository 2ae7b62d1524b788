"""GET /slots (the live slot registry), GET /metrics, POST /props and their
enabling flags, against a real server with real in-flight generations."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mlxcel_trio.server.surfaces.metrics import UPSTREAM_FAMILIES
from tests.conftest import wait_until

from .sse import complete, iter_sse_lines, post

pytestmark = pytest.mark.e2e

WAIT_S = 30
ENDLESS = {"prompt": "tell me", "n_predict": -1, "ignore_eos": True, "stream": True}


@contextlib.contextmanager
def live_stream(url: str, body: dict = ENDLESS):
    """A streaming generation that has produced its first token; closing
    the block disconnects it (the server cancels the job)."""
    with httpx.Client(timeout=WAIT_S) as c:
        with c.stream("POST", url + "/completion", json=body) as r:
            assert r.status_code == 200, r.read()
            lines = iter_sse_lines(r)
            assert any(ln.startswith("data: ") for ln in lines), "no first frame"
            yield r


def post_quietly(url: str) -> None:
    """A short generation whose outcome the caller does not read."""
    with contextlib.suppress(httpx.HTTPError):
        httpx.post(url + "/completion", json={"prompt": "x", "n_predict": 2}, timeout=WAIT_S)


def get(server, path: str) -> httpx.Response:
    return httpx.get(server.url + path, timeout=WAIT_S)


def slots(server) -> list[dict]:
    r = get(server, "/slots")
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def two_slots(tiny_model, start_server):
    return start_server(tiny_model, "-np", "2", "-c", "65536", "--metrics", "--props")


# -- /slots -----------------------------------------------------------------------

def test_slots_follow_live_requests(two_slots):
    srv = two_slots
    assert all(not s["is_processing"] for s in slots(srv))
    with live_stream(srv.url):
        busy = wait_until(lambda: [s for s in slots(srv) if s["is_processing"]], "a busy slot")
        assert [s["id"] for s in busy] == [0], "the lowest free slot serves the first request"
        s0 = busy[0]
        assert list(s0) == ["id", "n_ctx", "speculative", "is_processing", "id_task",
                            "n_prompt_tokens", "n_prompt_tokens_processed",
                            "n_prompt_tokens_cache", "params", "next_token"]
        assert s0["n_ctx"] == 32768 and s0["speculative"] is False
        assert s0["n_prompt_tokens"] > 0
        assert s0["params"]["n_predict"] == -1 and s0["params"]["ignore_eos"] is True
        assert "stop" not in s0["params"], "the reduced params form, as upstream's to_json(true)"
        assert "prompt" not in s0 and "generated" not in s0, "redacted without the debug env"
        (nt,) = s0["next_token"]
        assert nt["has_next_token"] is True and nt["n_remain"] == -1
        first = nt["n_decoded"]
        wait_until(lambda: slots(srv)[0]["next_token"][0]["n_decoded"] > first,
                   "n_decoded to advance")
        with live_stream(srv.url, {**ENDLESS, "n_predict": 100000}):
            both = wait_until(lambda: all(s["is_processing"] for s in slots(srv)) and slots(srv),
                              "both slots busy")
            assert both[1]["id_task"] != both[0]["id_task"]
            assert both[1]["next_token"][0]["n_remain"] <= 100000
            assert get(srv, "/health").json() == {"status": "ok"}, "load never changes /health"
            r = get(srv, "/slots?fail_on_no_slot=1")
            assert r.status_code == 503
            assert r.json() == {"error": {"code": 503, "message": "no slot available",
                                          "type": "unavailable_error"}}
        task0 = s0["id_task"]
    # a disconnect frees the slot; the slot still reports its last task
    idle = wait_until(lambda: (lambda ss: ss if not any(s["is_processing"] for s in ss)
                               else None)(slots(srv)), "every slot idle")
    assert idle[0]["id_task"] == task0
    assert idle[0]["next_token"][0]["has_next_token"] is False
    assert get(srv, "/slots?fail_on_no_slot=1").status_code == 200


def test_completion_reports_the_slot_it_ran_in(two_slots):
    res = complete(two_slots, prompt="hi", n_predict=2)
    assert res["id_slot"] == 0
    s0 = slots(two_slots)[0]
    assert s0["n_prompt_tokens"] == res["tokens_evaluated"]
    # released: the task stays, its counters are reset, as upstream's slot
    assert s0["next_token"][0]["n_decoded"] == 0 and s0["next_token"][0]["n_remain"] == -1


def test_slots_debug_env_shows_prompt_and_generated(tiny_model, start_server):
    srv = start_server(tiny_model, "-np", "1", env={"LLAMA_SERVER_SLOTS_DEBUG": "1"})
    res = complete(srv, prompt="hello there", n_predict=4, temperature=0)
    (s0,) = slots(srv)
    assert s0["generated"] == res["content"]
    assert "hello there" in s0["prompt"]
    assert "stop" in s0["params"], "the full params form under the debug env"


def test_no_slots_answers_501(tiny_model, start_server):
    srv = start_server(tiny_model, "-np", "1", "--no-slots")
    r = get(srv, "/slots")
    assert r.status_code == 501
    assert r.json() == {"error": {"code": 501, "message": "This server does not support slots "
                                  "endpoint. Start it with `--slots`", "type": "not_supported_error"}}
    assert httpx.get(srv.url + "/props").json()["endpoint_slots"] is False


# -- /props -------------------------------------------------------------------------

def test_props_endpoint_toggles_and_post(two_slots):
    props = get(two_slots, "/props").json()
    assert (props["endpoint_slots"], props["endpoint_props"], props["endpoint_metrics"]) == \
        (True, True, True)
    assert props["is_sleeping"] is False
    assert props["geometry"] == {"n_ctx": 65536, "n_ctx_slot": 32768, "n_slots": 2,
                                 "n_batch": 2048, "n_ubatch": 512, "cont_batching": True,
                                 "context_shift": False, "kv_unified": False}
    assert props["sleep_idle_seconds"] == -1
    r = post(two_slots.url, {"anything": 1}, path="/props")
    assert r.status_code == 200 and r.json() == {"success": True}
    assert get(two_slots, "/props").json() == props, "POST /props changes nothing, as upstream"


# -- /metrics -----------------------------------------------------------------------

def scrape(server) -> tuple[dict[str, float], str, httpx.Response]:
    r = get(server, "/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    values = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            key = sample.name + (json.dumps(sample.labels, sort_keys=True) if sample.labels else "")
            values[key] = sample.value
    return values, r.text, r


def upstream(values: dict, name: str) -> float:
    # prometheus-client's parser names every counter sample *_total, so
    # upstream's one suffix-less counter (n_tokens_max) reads back renamed
    return values[name] if name in values else values[name + "_total"]


def test_metrics_families_and_values_move(two_slots):
    srv = two_slots
    before, text, r = scrape(srv)
    start = int(r.headers["Process-Start-Time-Unix"])
    assert b"Process-Start-Time-Unix" in [k for k, _ in r.headers.raw], "upstream's spelling"
    assert abs(start - time.time()) < 3600
    for name in UPSTREAM_FAMILIES:
        # exactly the series names a llama-server scrape config selects
        assert any(line.startswith(name + " ") for line in text.splitlines()), name
        upstream(before, name)
    assert text.index("llamacpp:") < text.index("mlxcel_"), "upstream's families come first"

    a = complete(srv, prompt="one two three", n_predict=5, ignore_eos=True)
    b = complete(srv, prompt="four", n_predict=3, ignore_eos=True)
    after, _, _ = scrape(srv)

    def delta(name):
        return upstream(after, name) - upstream(before, name)

    assert delta("llamacpp:prompt_tokens_total") == \
        a["timings"]["prompt_n"] + b["timings"]["prompt_n"]
    assert delta("llamacpp:tokens_predicted_total") == 8
    assert delta("llamacpp:n_decode_total") >= 6
    assert delta("llamacpp:prompt_seconds_total") > 0
    assert delta("llamacpp:tokens_predicted_seconds_total") > 0
    assert upstream(after, "llamacpp:n_tokens_max") >= a["timings"]["prompt_n"] + 5
    assert upstream(after, "llamacpp:predicted_tokens_seconds") > 0
    assert upstream(after, "llamacpp:prompt_tokens_seconds") > 0
    assert upstream(after, "llamacpp:n_busy_slots_per_decode") >= 1
    assert after['mlxcel_requests_total{"outcome": "finished"}'] - \
        before['mlxcel_requests_total{"outcome": "finished"}'] == 2
    # the throughput gauges cover the window since the previous scrape
    again, _, _ = scrape(srv)
    assert upstream(again, "llamacpp:predicted_tokens_seconds") == 0
    assert upstream(again, "llamacpp:prompt_tokens_seconds") == 0
    assert upstream(again, "llamacpp:tokens_predicted_total") == \
        upstream(after, "llamacpp:tokens_predicted_total"), "counters are cumulative"


def test_metrics_requests_processing_and_deferred(tiny_model, start_server):
    srv = start_server(tiny_model, "-np", "1", "-c", "65536", "--metrics")
    with live_stream(srv.url):
        values, _, _ = scrape(srv)
        assert upstream(values, "llamacpp:requests_processing") == 1
        assert upstream(values, "llamacpp:requests_deferred") == 0
        # the second request waits for the only slot (its response head too)
        waiting = threading.Thread(target=post_quietly, args=(srv.url,), daemon=True)
        waiting.start()
        wait_until(lambda: upstream(scrape(srv)[0], "llamacpp:requests_deferred") == 1,
                   "the second request to wait for the only slot")
    # the disconnect frees the slot; the waiting request then runs and ends
    waiting.join(WAIT_S)
    values, _, _ = scrape(srv)
    assert upstream(values, "llamacpp:requests_processing") == 0
    assert upstream(values, "llamacpp:requests_deferred") == 0
    assert values['mlxcel_requests_total{"outcome": "cancelled"}'] == 1

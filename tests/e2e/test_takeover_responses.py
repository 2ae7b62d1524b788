"""Responses that outlive their process, on a lone `--session-store
file://DIR` server: a stored response (`store`) and a background one
(`background: true`) are created, the server is SIGKILLed while the
background run is mid-generation, and a new server on the same directory
answers GET /v1/responses/:id with the stored response, continues a
conversation from it (`previous_response_id`), and continues the
background run, whose GET ends "completed" with the output an
uninterrupted run gives.  A background run the new server cannot rebuild
(another chat template) ends "failed" naming why.
"""

from __future__ import annotations

import signal

import httpx
import pytest

from tests.conftest import wait_until

from .test_stream_resume import get_cut

pytestmark = pytest.mark.e2e

SESSION_PREFIX = "mlxcel-background-"   # server/sessions/response_store.py: a run's session
LONG = 400
BG = {"model": "m", "input": "Tell me a story about the engine.", "background": True,
      "max_output_tokens": LONG, "temperature": 0, "ignore_eos": True, "cache_prompt": False}
KEPT = {"model": "m", "input": "Hello", "max_output_tokens": 8, "temperature": 0}
BOUND_S = 120.0


def _get(url: str, rid: str) -> dict:
    r = httpx.get(f"{url}/v1/responses/{rid}", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _finished(url: str, rid: str) -> dict:
    return wait_until(lambda: _get(url, rid), f"background response {rid} to finish",
                      BOUND_S, until=lambda o: o["status"] not in ("queued", "in_progress"))


def _output(obj: dict) -> list:
    """The output items less their ids (another run draws other ids)."""
    return [{k: v for k, v in item.items() if k != "id"} for item in obj["output"]]


def _start_then_kill(server) -> dict:
    """A background run, killed with its server once its session holds bytes."""
    bg = httpx.post(server.url + "/v1/responses", json=BG, timeout=60).json()
    assert bg["status"] == "queued", bg
    # the run's own session log: the kill lands after its first tokens
    cid = SESSION_PREFIX + bg["id"]
    wait_until(lambda: httpx.post(server.url + "/v1/streams/lookup", timeout=10,
                                  json={"conversation_ids": [cid]}).json(),
               "the background run's session", 30)
    got, ended = get_cut(server.url, cid, 0, 3000)
    assert not ended and got.count(b"response.output_text.delta") > 5
    server.signal(signal.SIGKILL)
    server.wait(10)
    return bg


def test_stored_and_background_responses_survive_a_kill(tiny_model, start_server, tmp_path):
    store = f"file://{tmp_path / 'sessions'}"
    args = ("-c", "4096", "-np", "2", "--session-store", store, "--metrics")
    first = start_server(tiny_model, *args)
    ref = _finished(first.url, httpx.post(first.url + "/v1/responses", json=BG,
                                          timeout=60).json()["id"])
    assert ref["status"] == "completed" and ref["usage"]["output_tokens"] == LONG, ref
    kept = httpx.post(first.url + "/v1/responses", json=KEPT, timeout=60).json()
    assert kept["status"] == "completed"
    bg = _start_then_kill(first)

    second = start_server(tiny_model, *args)
    assert _get(second.url, kept["id"]) == kept        # the stored response, read back
    follow = httpx.post(second.url + "/v1/responses", timeout=60, json={
        **KEPT, "input": "And then?", "previous_response_id": kept["id"]}).json()
    assert follow["status"] == "completed" and follow["previous_response_id"] == kept["id"]
    alone = httpx.post(second.url + "/v1/responses", timeout=60,
                       json={**KEPT, "input": "And then?"}).json()
    # the earlier turns were rendered before the new input
    assert follow["usage"]["input_tokens"] > alone["usage"]["input_tokens"], (follow, alone)

    done = _finished(second.url, bg["id"])
    assert done["status"] == "completed", done
    assert _output(done) == _output(ref)
    assert done["usage"]["output_tokens"] == LONG
    assert done["id"] == bg["id"] and done["created_at"] == bg["created_at"]
    second.wait_for_text(f"stream {SESSION_PREFIX + bg['id']!r} continued from byte")
    # the completed run is stored as any response: a conversation goes on from it
    more = httpx.post(second.url + "/v1/responses", timeout=60, json={
        **KEPT, "input": "And then?", "previous_response_id": bg["id"]}).json()
    assert more["status"] == "completed", more


def test_a_background_run_it_cannot_rebuild_fails_naming_why(tiny_model, start_server,
                                                              tmp_path):
    store = f"file://{tmp_path / 'sessions'}"
    args = ("-c", "4096", "-np", "2", "--session-store", store)
    bg = _start_then_kill(start_server(tiny_model, *args))
    # another chat template renders another prompt: the recorded one cannot be rebuilt
    second = start_server(tiny_model, *args, "--chat-template", "llama3")
    done = _finished(second.url, bg["id"])
    assert done["status"] == "failed", done
    assert "cannot be continued" in done["error"]["message"], done
    assert "prompt" in done["error"]["message"], done

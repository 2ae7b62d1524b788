"""Streams that outlive their process, end to end: a lone server with
`--session-store file://DIR` is SIGKILLed in the middle of resumable
streams, a new server starts on the same directory, continues each
unfinished generation, and a client resuming with the usual
`GET /v1/stream?conv_id=&from=N` (from the bytes it had) receives the
stream an uninterrupted run sends: frame for frame (only timings and, for
the native route, nothing else may differ), one final event, no gap and no
repeat.  The continued chat chunks keep the first process's id.

Every case is killed after its first bytes reached the client, and the new
server's log must say the stream was continued from a byte offset (a case
the first server had already finished would prove nothing).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest import wait_until
from tests.store_server import StoreServer

from .test_stream_resume import (
    GREEDY,
    HEADER,
    PROMPT,
    frames,
    get_cut,
    lookup,
    post_cut,
)

pytestmark = pytest.mark.e2e

LONG = 1000  # tokens: a SIGKILL right after the first bytes lands mid-stream
# no prompt cache: the reference runs would report cached tokens the fresh
# server's continuation cannot have (the one field that depends on history)
GREEDY = {**GREEDY, "cache_prompt": False}
CHAT = [{"role": "user", "content": "Tell me a story about the engine."}]
CASES = {
    "completion": ("/completion", {"prompt": PROMPT, "n_predict": LONG, **GREEDY}),
    "chat": ("/v1/chat/completions",
             {"model": "m", "messages": CHAT, "max_tokens": LONG, **GREEDY}),
    "v1-completions": ("/v1/completions",
                       {"model": "m", "prompt": PROMPT, "max_tokens": LONG, **GREEDY}),
    "grammar": ("/completion", {"prompt": PROMPT, "n_predict": LONG, **GREEDY,
                                "grammar": 'root ::= ("ab" | "cd" | " " | "e")+'}),
    "seeded": ("/completion", {"prompt": PROMPT, "n_predict": LONG, "stream": True,
                               "temperature": 0.9, "seed": 1234, "ignore_eos": True,
                               "cache_prompt": False}),
}
# a stop string met late in the greedy text: found in the reference run
STOP_CASE = "stop"


def _plain(url: str, path: str, body: dict) -> bytes:
    raw, ended = post_cut(url, path, body, None, 1 << 30)
    assert ended
    return raw


def _references(url: str, cases: dict) -> dict:
    """Each case's uninterrupted stream, the cases run side by side (a
    batch gives each stream what a solo run does: test_batching.py)."""
    with ThreadPoolExecutor(len(cases)) as pool:
        runs = {name: pool.submit(_plain, url, path, body) for name, (path, body) in cases.items()}
        return {name: run.result() for name, run in runs.items()}


def _comparable(raw: bytes) -> list:
    """frames() less the slot that served it (any free slot may continue it)."""
    def strip(obj):
        if isinstance(obj, dict):
            return {k: strip(v) for k, v in obj.items() if k != "id_slot"}
        if isinstance(obj, (list, tuple)):
            return [strip(v) for v in obj]
        return obj
    return strip(frames(raw))


def _cut_then_kill(server, cases: dict, prefix: str) -> tuple[dict, dict]:
    """Start every case as a resumable stream on `server`, keep each one's
    first bytes, SIGKILL the server: (ids, bytes kept) by case."""
    convs = {name: f"{prefix}-{name}-{uuid.uuid4()}" for name in cases}
    have = {}
    for name, (path, body) in cases.items():
        got, ended = post_cut(server.url, path, body, convs[name], 200)
        assert not ended
        have[name] = got
    server.signal(signal.SIGKILL)
    server.wait(10)
    return convs, have


def _resume_all(server, cases: dict, convs: dict, have: dict, ref: dict) -> None:
    """Each client resumes through `server` from the bytes it kept and gets
    the uninterrupted run's stream; the server says it continued each one
    (so none had finished before the kill) and counts them."""
    for name, (path, _body) in cases.items():
        conv = convs[name]
        tail, ended = get_cut(server.url, conv, len(have[name]))
        assert ended, name
        full = have[name] + tail
        assert _comparable(full) == _comparable(ref[name]), name
        assert get_cut(server.url, conv, 0)[0] == full, name   # the log is the one stream
        (info,) = lookup(server.url, conv)
        assert info["is_done"] and info["total_bytes"] == len(full), name
        if path == "/v1/chat/completions":
            assert len(_chat_ids(full)) == 1, name  # the continuation kept its id
    for conv in convs.values():
        server.wait_for_text(f"stream {conv!r} continued from byte")
    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    assert f'mlxcel_stream_takeovers_total{{outcome="continued"}} {len(cases)}.0' in metrics


def _chat_ids(raw: bytes) -> set[str]:
    out = set()
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: {"):
            out.add(json.loads(block[6:]).get("id"))
    return out


def test_a_killed_server_s_streams_continue_after_a_restart(tiny_model, start_server,
                                                              tmp_path):
    store = f"file://{tmp_path / 'sessions'}"
    args = ("-c", "12288", "-np", "6", "--session-store", store, "--metrics")
    first = start_server(tiny_model, *args)
    cases, ref = _cases_with_stop(first.url)

    convs, have = _cut_then_kill(first, cases, "takeover")
    second = start_server(tiny_model, *args)
    _resume_all(second, cases, convs, have, ref)
    metrics = httpx.get(second.url + "/metrics", timeout=10).text
    assert f"mlxcel_stream_takeover_first_token_seconds_count {len(cases)}.0" in metrics


def test_a_session_it_cannot_rebuild_ends_with_an_error_frame(tiny_model, start_server,
                                                                tmp_path):
    store = f"file://{tmp_path / 'sessions'}"
    args = ("-c", "4096", "-np", "2", "--session-store", store)
    first = start_server(tiny_model, *args)
    conv = f"cannot-{uuid.uuid4()}"
    body = {"model": "m", "messages": CHAT, "max_tokens": LONG, **GREEDY}
    got, ended = post_cut(first.url, "/v1/chat/completions", body, conv, 200)
    assert not ended
    first.signal(signal.SIGKILL)
    first.wait(10)
    # another chat template renders another prompt: the recorded one cannot be rebuilt
    second = start_server(tiny_model, *args, "--chat-template", "llama3")
    tail, ended = get_cut(second.url, conv, len(got))
    assert ended
    last = tail.rstrip().split(b"\n\n")[-1]
    err = json.loads(last[6:])["error"]
    assert err["type"] == "unavailable_error"
    assert "cannot be continued" in err["message"] and "prompt" in err["message"], err
    assert b"[DONE]" not in tail


def test_an_unusable_directory_is_refused_before_the_model_loads(tiny_model, tmp_path):
    import subprocess
    import sys

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    out = subprocess.run([sys.executable, "-m", "mlxcel_trio", "-m", str(tiny_model),
                          "--session-store", f"file://{blocker}"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "--session-store" in out.stderr and "is not a directory" in out.stderr, out.stderr
    assert "memory" in out.stderr


def test_a_second_server_on_the_same_directory_is_refused(tiny_model, start_server, tmp_path):
    import subprocess
    import sys

    store = f"file://{tmp_path / 'sessions'}"
    start_server(tiny_model, "-c", "2048", "-np", "1", "--session-store", store)
    out = subprocess.run([sys.executable, "-m", "mlxcel_trio", "-m", str(tiny_model),
                          "--session-store", store], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "another server is using" in out.stderr, out.stderr




KILL_STREAMS = 20
BG_SESSION = "mlxcel-background-"   # server/sessions/response_store.py: a run's session id


def _response_done(url: str, rid: str) -> dict:
    """GET /v1/responses/:id until it is no longer queued or in progress."""
    return wait_until(lambda: httpx.get(f"{url}/v1/responses/{rid}", timeout=30).json(),
                      f"response {rid} to finish", 120,
                      until=lambda o: o.get("status") not in ("queued", "in_progress"))


def _output(obj: dict) -> list:
    """A response's output items less their ids (another run draws others)."""
    return [{k: v for k, v in item.items() if k != "id"} for item in obj["output"]]


def _stop_case(ref_completion: bytes) -> tuple[str, dict]:
    """A stop string taken from the middle of the greedy text."""
    text = "".join(json.loads(b[6:])["content"] for b in ref_completion.split(b"\n\n")
                   if b.startswith(b"data: {"))
    stop = text[len(text) // 2:len(text) // 2 + 6]
    return "/completion", {"prompt": PROMPT, "n_predict": LONG, **GREEDY, "stop": [stop]}


def _cases_with_stop(url: str) -> tuple[dict, dict]:
    """CASES plus a stop-string case cut from the greedy completion, and
    every case's uninterrupted stream from the server at `url`."""
    cases = dict(CASES)
    ref = _references(url, cases)
    cases[STOP_CASE] = _stop_case(ref["completion"])
    ref[STOP_CASE] = _plain(url, *cases[STOP_CASE])
    assert b'"stop_type":"word"' in ref[STOP_CASE]
    return cases, ref


def _repeated(kinds: dict, once: dict, n: int) -> tuple[dict, dict]:
    """n streams cycling through `kinds`, each with its kind's reference
    (the same request gives the same stream: a batch row runs as a solo run)."""
    names = [list(kinds)[i % len(kinds)] for i in range(n)]
    return ({f"{name}-{i}": kinds[name] for i, name in enumerate(names)},
            {f"{name}-{i}": once[name] for i, name in enumerate(names)})


def test_one_kill_of_a_replica_takes_twenty_streams_at_different_points_over(
        tiny_model, start_server):
    """Two replicas on a real Redis.  20 resumable streams (greedy, chat,
    /v1/completions, a grammar, a stop string, seeded sampling) start one
    after another on the owner, so they stand at different points, plus an
    unseeded stream, a mirostat one, a stored and a background response;
    the owner is SIGKILLed once at a moment drawn from a printed seed.
    Every client, reading through the survivor, gets the uninterrupted
    run's stream; the unseeded one a whole answer; the mirostat one an error
    frame naming why; the background response, polled through the
    survivor, ends "completed" with the uninterrupted run's output; the
    stored response reads back whole.  The claim does not
    wait for the owner's heartbeat to lapse: its connections are gone."""
    seed = int(os.environ.get("MLXCEL_TEST_KILL_SEED") or random.randrange(1 << 31))
    print(f"kill seed {seed} (MLXCEL_TEST_KILL_SEED={seed} replays it)")
    rng = random.Random(seed)
    store = StoreServer().start()
    try:
        slots = KILL_STREAMS + 4
        args = ("-c", str(2048 * slots), "-np", str(slots), "--session-store", store.url,
                "--metrics")
        # the default 10 s replica TTL: the survivor sees the owner's
        # connections gone and claims before its heartbeat key lapses
        owner = start_server(tiny_model, *args)
        survivor = start_server(tiny_model, *args)
        bg_body = {"model": "m", "input": "Hello", "background": True,
                   "max_output_tokens": LONG, "temperature": 0, "ignore_eos": True,
                   "cache_prompt": False}
        bg_ref = httpx.post(survivor.url + "/v1/responses", json=bg_body, timeout=60).json()
        kinds, ref = _cases_with_stop(survivor.url)
        cases, refs = _repeated(kinds, ref, KILL_STREAMS)

        kept = httpx.post(owner.url + "/v1/responses", timeout=60, json={
            "model": "m", "input": "Hello", "max_output_tokens": 8, "temperature": 0}).json()
        assert kept["status"] == "completed"
        extra = {"unseeded": ("/completion", {"prompt": PROMPT, "n_predict": LONG,
                                              "stream": True, "temperature": 1.0,
                                              "ignore_eos": True, "cache_prompt": False}),
                 "mirostat": ("/completion", {"prompt": PROMPT, "n_predict": LONG, **GREEDY,
                                              "temperature": 0.8, "mirostat": 2,
                                              "seed": 7})}
        convs = {name: f"kill-{name}-{uuid.uuid4()}" for name in [*cases, *extra]}
        have = {}
        for name, (path, body) in {**cases, **extra}.items():   # one after another
            got, ended = post_cut(owner.url, path, body, convs[name], rng.randint(150, 600))
            assert not ended, name
            have[name] = got
        # a background response, its run under way (its own session log holds it)
        bg = httpx.post(owner.url + "/v1/responses", json=bg_body, timeout=60).json()
        wait_until(lambda: lookup(owner.url, BG_SESSION + bg["id"]),
                   "the background run's session", 30)
        time.sleep(rng.uniform(0.0, 1.0))   # the kill moment the seed draws
        owner.signal(signal.SIGKILL)
        owner.wait(10)

        with ThreadPoolExecutor(8) as pool:   # every client reads through the survivor
            tails = {name: pool.submit(get_cut, survivor.url, convs[name], len(have[name]))
                     for name in convs}
            full = {}
            for name, tail in tails.items():
                got, ended = tail.result()
                assert ended, name
                full[name] = have[name] + got
        for name in cases:
            assert _comparable(full[name]) == _comparable(refs[name]), (name, seed)
            (info,) = lookup(survivor.url, convs[name])
            assert info["is_done"] and info["total_bytes"] == len(full[name]), name
            if cases[name][0] == "/v1/chat/completions":
                assert len(_chat_ids(full[name])) == 1, name
        survivor.wait_for_text("has no connection left", timeout=1)
        for name in [*cases, "unseeded"]:   # none had ended before the kill
            survivor.wait_for_text(f"stream {convs[name]!r} continued from byte")

        got = [json.loads(b[6:]) for b in full["unseeded"].split(b"\n\n")
               if b.startswith(b"data: {")]
        counts = [f["tokens_predicted"] for f in got if not f["stop"]]
        assert [f["stop"] for f in got].count(True) == 1 and got[-1]["stop"]
        assert got[-1]["tokens_predicted"] == LONG and counts[-1] == LONG
        assert all(b > a for a, b in zip(counts, counts[1:]))   # no gap, no repeat

        last = full["mirostat"].rstrip().split(b"\n\n")[-1]
        err = json.loads(last[6:])["error"]
        assert err["type"] == "unavailable_error" and "mirostat" in err["message"], err

        metrics = httpx.get(survivor.url + "/metrics", timeout=10).text
        # the streams, the unseeded one and the background response's run
        assert f'mlxcel_stream_takeovers_total{{outcome="continued"}} {len(cases) + 2}.0' \
            in metrics
        assert 'mlxcel_stream_takeovers_total{outcome="failed"} 1.0' in metrics

        again = httpx.get(f"{survivor.url}/v1/responses/{kept['id']}", timeout=10).json()
        assert again == kept
        # the background response was continued by the survivor: the output
        # of an uninterrupted run, under the id the owner answered
        done = _response_done(survivor.url, bg["id"])
        assert done["status"] == "completed", done
        assert _output(done) == _output(_response_done(survivor.url, bg_ref["id"]))
        assert done["usage"]["output_tokens"] == LONG and done["created_at"] == bg["created_at"]
        survivor.wait_for_text(f"stream {BG_SESSION + bg['id']!r} continued from byte")
        cancel = httpx.post(f"{survivor.url}/v1/responses/{bg['id']}/cancel", timeout=10)
        assert cancel.json()["status"] == "completed"   # a finished one is answered unchanged
    finally:
        store.stop()


ROLLING_STREAMS = 8


def test_a_rolling_restart_hands_every_stream_on(tiny_model, start_server):
    """SIGTERM on a replica hands its live streams to its peer at once (no
    wait for the heartbeat to lapse); restarting A, then B, under 8 live
    streams cuts none: each client, reading through the replica still up,
    gets the uninterrupted stream."""
    store = StoreServer().start()
    try:
        # the default 10 s replica TTL: a peer that claimed within it was handed the streams
        args = ("-c", str(2048 * ROLLING_STREAMS), "-np", str(ROLLING_STREAMS),
                "--session-store", store.url, "--metrics")
        a = start_server(tiny_model, *args)
        b = start_server(tiny_model, *args)
        kinds = {name: CASES[name] for name in ("completion", "chat", "grammar", "seeded")}
        cases, ref = _repeated(kinds, _references(b.url, kinds), ROLLING_STREAMS)
        convs = {name: f"rolling-{name}-{uuid.uuid4()}" for name in cases}
        have = {}
        for name, (path, body) in cases.items():
            got, ended = post_cut(a.url, path, body, convs[name], 200)
            assert not ended
            have[name] = got
        t0 = time.monotonic()
        a.signal(signal.SIGTERM)
        assert a.wait(15) == 0
        for conv in convs.values():
            b.wait_for_text(f"stream {conv!r} continued from byte", timeout=8)
        assert time.monotonic() - t0 < 8    # handed off, not left to the 10 s TTL
        a2 = start_server(tiny_model, *args)
        for name in cases:                  # B holds them now: read a little through B
            got, _ = get_cut(b.url, convs[name], len(have[name]), 100)
            have[name] += got
        b.signal(signal.SIGTERM)            # then B restarts too
        assert b.wait(15) == 0
        for name, (path, _body) in cases.items():
            tail, ended = get_cut(a2.url, convs[name], len(have[name]))
            assert ended, name
            full = have[name] + tail
            assert _comparable(full) == _comparable(ref[name]), name
    finally:
        store.stop()

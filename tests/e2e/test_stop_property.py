"""Stop strings, property-tested against the one-shot reference.

The greedy continuation of the fixture's `long_prompt` is deterministic, so
for any stop list the served content must equal
`apply_stops(free_text, stops)[0]`, where `free_text` is the same generation
without stops, and streaming must deliver exactly that text in pieces.  Stop
lists mix substrings of the free text (which cut it, often across a token
boundary), near-misses that share a prefix with the text and then diverge
(held back, then released), and random strings.
"""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlxcel_trio.engine.stops import apply_stops

from .sse import post

pytestmark = pytest.mark.e2e

N_PREDICT = 48


def stream_frames(url: str, body: dict) -> list[dict]:
    """SSE frames split on "\\n" only, as the SSE spec says.  (httpx's
    iter_lines, used by the shared helper, also splits on U+0085, U+2028 and
    U+2029, which JSON sends unescaped: a stop list holding one of them,
    echoed in the final frame, would be cut in two.)"""
    with httpx.Client(timeout=60) as c:
        r = c.post(url + "/completion", json={**body, "stream": True})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    frames = []
    for line in r.content.split(b"\n"):
        if line.startswith(b"data: "):
            frames.append(json.loads(line[6:].decode("utf-8")))
    return frames


def stop_lists(text: str) -> st.SearchStrategy[list[str]]:
    n = len(text)
    spans = st.tuples(st.integers(0, n - 1), st.integers(1, 10)).map(
        lambda t: text[t[0]:t[0] + t[1]])
    near_misses = st.tuples(spans, st.text(min_size=1, max_size=3)).map("".join)
    tails = st.integers(1, 6).map(lambda k: text[-k:] + "\x00")  # pending at the end
    randoms = st.text(max_size=6)
    item = st.one_of(spans, spans, near_misses, tails, randoms)
    return st.lists(item, min_size=1, max_size=4)


def test_stops_match_the_one_shot_reference(server, tiny_facts):
    base = {"prompt": tiny_facts["long_prompt"], "n_predict": N_PREDICT, "temperature": 0,
            "ignore_eos": True}
    free = post(server.url, base).json()
    assert free["stop_type"] == "limit" and free["tokens_predicted"] == N_PREDICT
    free_text = free["content"]
    assert len(set(free_text)) > 8, free_text  # enough variety for meaningful stops
    seen_word_stops = []

    @settings(max_examples=15, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(stop_lists(free_text))
    def check(stops):
        expected, word = apply_stops(free_text, stops)
        r = post(server.url, {**base, "stop": stops})
        assert r.status_code == 200, r.text
        whole = r.json()
        *partials, final = stream_frames(server.url, {**base, "stop": stops})
        streamed = "".join(f["content"] for f in partials)

        assert whole["content"] == expected, (stops, whole["content"])
        assert streamed == whole["content"], (stops, streamed)
        assert (final["stop_type"], final["stopping_word"]) == \
            (whole["stop_type"], whole["stopping_word"])
        if word:
            seen_word_stops.append(word)
            assert (whole["stop_type"], whole["stopping_word"]) == ("word", word)
            assert whole["tokens_predicted"] <= N_PREDICT
        else:
            assert (whole["stop_type"], whole["stopping_word"]) == ("limit", "")
            assert whole["tokens_predicted"] == N_PREDICT
        assert whole["generation_settings"]["stop"] == [s for s in stops if s]

    check()
    assert seen_word_stops, "no example stopped on a word: the property was not exercised"


def test_a_stop_at_the_very_start_yields_nothing(server, tiny_facts):
    base = {"prompt": tiny_facts["long_prompt"], "n_predict": 16, "temperature": 0,
            "ignore_eos": True}
    text = post(server.url, base).json()["content"]
    res = post(server.url, {**base, "stop": [text[:2]]}).json()
    assert res["content"] == "" and res["stop_type"] == "word"
    assert res["stopping_word"] == text[:2]
    frames = stream_frames(server.url, {**base, "stop": [text[:2]]})
    assert "".join(f["content"] for f in frames[:-1]) == ""
    assert frames[-1]["stop_type"] == "word"

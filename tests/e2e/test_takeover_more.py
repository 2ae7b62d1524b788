"""Takeover of the requests test_takeover.py does not cover, on the trained
fixture with a lone `--session-store file://DIR` server (SIGKILL, restart,
resume): a LoRA request (the adapter's style, at the request's scale), a
thinking request (reasoning_content deltas, then the answer), a greedy
`n_probs` stream (each token frame's probabilities, the replayed ones
included), and an unseeded sampled stream, which cannot equal any reference:
it must come out whole, each token counted once (`tokens_predicted` rises
frame by frame to exactly n_predict, EOS ignored), with one final frame.
The LoRA and thinking requests are also taken over by a peer: two replicas
on a real Redis, the owner SIGKILLed.
"""

from __future__ import annotations

import json
import math
import signal
import uuid

import pytest

from .test_stream_resume import PROMPT, get_cut, lookup, post_cut
from .test_takeover import _comparable, _plain

pytestmark = pytest.mark.e2e

LONG = 300   # tokens: the SIGKILL right after the first bytes lands mid-stream
GREEDY = {"temperature": 0, "ignore_eos": True, "stream": True, "cache_prompt": False}
# in the corpus's shape: the model thinks, closes the block and answers
USER = [{"role": "user", "content": "Please tell a story about a fox called Tom."}]
CHAT = "/v1/chat/completions"
CASES = {
    "lora": (CHAT, {"messages": USER, "max_tokens": LONG, **GREEDY,
                    "lora": [{"id": 0, "scale": 1.0}],
                    "chat_template_kwargs": {"enable_thinking": False}}),
    "thinking": (CHAT, {"messages": USER, "max_tokens": LONG, **GREEDY,
                        "reasoning_format": "deepseek"}),
    "n_probs": ("/completion", {"prompt": PROMPT, "n_predict": LONG, **GREEDY, "n_probs": 3}),
}
UNSEEDED = ("/completion", {"prompt": PROMPT, "n_predict": LONG, "stream": True,
                            "temperature": 1.0, "ignore_eos": True, "cache_prompt": False})


def _data(raw: bytes) -> list[dict]:
    return [json.loads(b[6:]) for b in raw.split(b"\n\n") if b.startswith(b"data: {")]


def _close(a, b) -> bool:
    """Equal, floats within the rounding a prefill of prompt + published
    tokens may differ by from the step-by-step decode."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and \
            math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-4)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == b


def _show_what_they_claim(ref: dict) -> None:
    """The adapter's style in the LoRA run, a thinking block then an answer."""
    lora_text = "".join(c["choices"][0]["delta"].get("content") or ""
                        for c in _data(ref["lora"]) if c.get("choices"))
    assert lora_text.startswith("Sure!"), lora_text[:80]
    deltas = [c["choices"][0]["delta"] for c in _data(ref["thinking"]) if c.get("choices")]
    assert any(d.get("reasoning_content") for d in deltas)
    assert any(d.get("content") for d in deltas)


def _cut_then_kill(owner, cases: dict, tag: str) -> tuple[dict, dict]:
    """Each case started on `owner` under a fresh conversation id and cut
    after 200 bytes, none ended; then the owner SIGKILLed.  The ids and
    the bytes each client had."""
    convs = {name: f"{tag}-{name}-{uuid.uuid4()}" for name in cases}
    have = {}
    for name, (path, body) in cases.items():
        got, ended = post_cut(owner.url, path, body, convs[name], 200)
        assert not ended, name
        have[name] = got
    owner.signal(signal.SIGKILL)
    owner.wait(10)
    return convs, have


def test_lora_thinking_probs_and_unseeded_streams_continue(start_server, tmp_path):
    from fixtures.build import ensure

    store = f"file://{tmp_path / 'sessions'}"
    args = ("-c", "8192", "-np", "4", "--session-store", store, "--metrics",
            "--lora-scaled", f"{ensure('trained-lora')}:0")
    first = start_server(ensure("trained"), *args)
    ref = {name: _plain(first.url, path, body) for name, (path, body) in CASES.items()}
    _show_what_they_claim(ref)
    assert all("completion_probabilities" in f for f in _data(ref["n_probs"])
               if not f["stop"])

    cases = {**CASES, "unseeded": UNSEEDED}
    convs, have = _cut_then_kill(first, cases, "more")

    second = start_server(ensure("trained"), *args)
    full = {}
    for name in cases:
        tail, ended = get_cut(second.url, convs[name], len(have[name]))
        assert ended, name
        full[name] = have[name] + tail
        (info,) = lookup(second.url, convs[name])
        assert info["is_done"] and info["total_bytes"] == len(full[name]), name
    for conv in convs.values():   # none had ended before the kill
        second.wait_for_text(f"stream {conv!r} continued from byte")
    for name in ("lora", "thinking"):
        assert _comparable(full[name]) == _comparable(ref[name]), name
    assert _close(_comparable(full["n_probs"]), _comparable(ref["n_probs"]))

    got = _data(full["unseeded"])
    final = [f for f in got if f["stop"]]
    counts = [f["tokens_predicted"] for f in got if not f["stop"]]
    assert len(final) == 1 and got[-1] is final[0]
    assert final[0]["tokens_predicted"] == LONG and counts[-1] == LONG
    # each token once: a repeat, or ids the continuation did not replay,
    # would count back (a frame is left out only for a token ending
    # mid-UTF-8, whose text the next frame carries)
    assert all(b > a for a, b in zip(counts, counts[1:])), counts


def test_lora_and_thinking_streams_continue_on_a_peer(start_server):
    """The same LoRA and thinking requests on two replicas sharing a real
    Redis: the owner is SIGKILLed with both mid-stream, and each client,
    reading through the survivor, gets the uninterrupted run's stream."""
    from fixtures.build import ensure

    from tests.store_server import StoreServer

    store = StoreServer().start()
    try:
        args = ("-c", "4096", "-np", "2", "--session-store", store.url,
                "--lora-scaled", f"{ensure('trained-lora')}:0")
        owner = start_server(ensure("trained"), *args)
        survivor = start_server(ensure("trained"), *args)
        cases = {name: CASES[name] for name in ("lora", "thinking")}
        ref = {name: _plain(survivor.url, path, body) for name, (path, body) in cases.items()}
        _show_what_they_claim(ref)
        convs, have = _cut_then_kill(owner, cases, "peer")
        for name in cases:
            tail, ended = get_cut(survivor.url, convs[name], len(have[name]))
            assert ended, name
            full = have[name] + tail
            assert _comparable(full) == _comparable(ref[name]), name
        for conv in convs.values():   # none had ended before the kill
            survivor.wait_for_text(f"stream {conv!r} continued from byte")
    finally:
        store.stop()

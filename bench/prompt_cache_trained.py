"""Prompt cache on multi-turn chats of the trained fixture: TTFT of a
follow-up turn whose history the slot still holds, against the same turn
cold (`cache_prompt: false`), one server, one slot.

    python bench/prompt_cache_trained.py            # ~1 min on 2 cores
    python bench/prompt_cache_trained.py --turns 8

Stream resume on the same conversation: each follow-up turn is also streamed
with an `X-Conversation-Id`, the connection is dropped after the first few
body bytes, and `GET /v1/stream?conv_id=..&from=N` is timed from the request
to its first byte; the two halves must rebuild the uninterrupted answer.

The conversation is held-out chats of the trained model (its own greedy
answers appended turn by turn), so the history is what a user of the demo
builds.  TTFT is send -> first streamed delta; the cached figure is the
median over the follow-up turns, each asked right after the previous turn.
mlx-lm's own prefill of the same final prompt is the peer.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as C


def ttft(client, url: str, messages: list[dict], cache: bool) -> tuple[float, str]:
    body = {"messages": messages, "stream": True, "temperature": 0, "max_tokens": 160,
            "cache_prompt": cache, "chat_template_kwargs": {"enable_thinking": False}}
    first, text = None, []
    t0 = time.perf_counter()
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"]
            if delta.get("content"):
                first = first or time.perf_counter() - t0
                text.append(delta["content"])
    return first, "".join(text)


def sse_text(raw: bytes) -> str:
    """The content deltas of a chat SSE body, joined."""
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:])["choices"][0]["delta"].get("content") or "")
    return "".join(out)


def resume_ttfb(client, url: str, messages: list[dict], conv: str, cut: int
                ) -> tuple[float, bool]:
    """Drop a chat stream after `cut` body bytes and resume it from there: the
    time from the resume request to its first byte, and whether the two parts
    rebuild the text of the same request streamed whole (ids and timestamps
    differ between requests, so text is compared, not bytes)."""
    body = {"messages": messages, "stream": True, "temperature": 0, "max_tokens": 160,
            "chat_template_kwargs": {"enable_thinking": False}}
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        whole = r.read()
    head = b""
    with client.stream("POST", url + "/v1/chat/completions", json=body,
                       headers={"X-Conversation-Id": conv}) as r:
        for chunk in r.iter_bytes():
            head += chunk
            if len(head) >= cut:
                break
    t0 = time.perf_counter()
    first, tail = None, b""
    with client.stream("GET", url + "/v1/stream",
                       params={"conv_id": conv, "from": len(head)}) as r:
        assert r.status_code == 200, r.read()
        for chunk in r.iter_bytes():
            first = first or time.perf_counter() - t0
            tail += chunk
    return first, sse_text(head + tail) == sse_text(whole)


def main(argv=None) -> int:
    import httpx

    from fixtures import trained_corpus as corpus
    from fixtures.build import ensure

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--blas", default="auto")
    args = ap.parse_args(argv)
    model = ensure("trained")
    asks = [[m for m in c.messages if m["role"] == "user"][0]["content"]
            for c in corpus.held_out(seed=880_002, n=args.turns)]
    port = C.free_port()
    proc = C.start_server(model, port, ["-c", "8192", "-np", "1"], C.server_env(args.blas))
    url = f"http://127.0.0.1:{port}"
    warm, cold, history = [], [], []
    try:
        with httpx.Client(timeout=300) as client:
            for i, ask in enumerate(asks):
                history.append({"role": "user", "content": ask})
                if i:  # the same follow-up turn cold first, then the cached run of it
                    cold.append(ttft(client, url, history, cache=False)[0])
                    ttft(client, url, history[:-1], cache=True)  # the slot holds the history again
                t, answer = ttft(client, url, history, cache=True)
                if i:
                    warm.append(t)
                history.append({"role": "assistant", "content": answer})
            resumed = [resume_ttfb(client, url, history[: 2 * i + 1], f"bench-resume-{i}", 64)
                       for i in range(1, len(asks))]
            n_prompt = len(httpx.post(url + "/apply-template", json={"messages": history[:-1]})
                           .json().get("prompt", ""))
    finally:
        proc.terminate()
        proc.wait(60)
    print(f"model {model} | {len(asks)} turns | last prompt {n_prompt} chars | load "
          f"{Path('/proc/loadavg').read_text().split()[:3]}")
    cw, cc = C.median(warm), C.median(cold)
    print(f"follow-up TTFT cached {cw * 1e3:.1f} ms | cold {cc * 1e3:.1f} ms | "
          f"cold/cached {cc / cw:.2f}x")
    print(f"stream resume: request -> first byte median "
          f"{C.median([t for t, _ in resumed]) * 1e3:.1f} ms over {len(resumed)} turns | "
          f"rebuilt the uninterrupted text: {sum(ok for _, ok in resumed)}/{len(resumed)}")
    print("per turn (cached, cold) ms:", [(round(a * 1e3, 1), round(b * 1e3, 1))
                                         for a, b in zip(warm, cold)])
    return 0


if __name__ == "__main__":
    sys.exit(main())

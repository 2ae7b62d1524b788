"""Embeddings: the server against the same encoder run directly in one MLX
batch, one input at a time, and the cost of an embedding load to a chat
stream beside it.

    python bench/embeddings.py                       # tiny fixtures, ~30 s
    python bench/embeddings.py --model DIR --chat DIR [--inputs 64 --tokens 100]

1. `mlxcel-server -m ENCODER --embeddings`: INPUTS token arrays of TOKENS
   ids each in one POST /v1/embeddings (median of --rounds), against the
   same ids run here as one right-padded MLX batch (forward + mean pooling
   + L2), and against INPUTS requests of one input each, sent one after the
   other.  Ratios are inputs per second, server / direct (target >= 0.9x).
2. `mlxcel-server -m CHAT --embedding-model ENCODER`: one greedy stream's
   inter-token gaps (median, p90, max) alone, then while a client keeps
   sending the same embedding batches (a chunk of -b tokens of inputs runs
   between two decode steps, so the max gap grows by one chunk).
Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import make_prompt, vocab_ids  # noqa: E402
from tests.conftest import ServerProcess  # noqa: E402


def _inputs(model: Path, n: int, length: int) -> list[list[int]]:
    ids = vocab_ids(model)
    return [make_prompt(ids, length, seed) for seed in range(n)]


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def direct(model: Path, inputs: list[list[int]], rounds: int) -> float:
    """Seconds for one MLX batch of every input (median), as the server computes it."""
    import mlx.core as mx
    import numpy as np

    from mlxcel_trio.engine.encoders import load

    enc, info = load(model)
    L = max(map(len, inputs))
    ids = np.full((len(inputs), L), info.pad_token_id, np.int32)
    mask = np.zeros_like(ids)
    for i, row in enumerate(inputs):
        ids[i, :len(row)], mask[i, :len(row)] = row, 1
    a, m = mx.array(ids), mx.array(mask)

    def run():
        h = enc(a, m, mx.zeros_like(a))
        mf = m.astype(h.dtype)[:, :, None]
        v = (h * mf).sum(axis=1) / mf.sum(axis=1)
        v = v / mx.sqrt((v * v).sum(axis=1, keepdims=True))
        np.array(v)

    run()  # compile / allocate once
    return statistics.median(_timed(run) for _ in range(rounds))


def server_side(url: str, inputs: list[list[int]], rounds: int) -> tuple[float, float]:
    def batch():
        r = httpx.post(url + "/v1/embeddings", json={"input": inputs}, timeout=600)
        r.raise_for_status()

    def singles():
        for row in inputs:
            httpx.post(url + "/v1/embeddings", json={"input": [row]}, timeout=600)

    batch()
    many = statistics.median(_timed(batch) for _ in range(rounds))
    one = _timed(singles)
    return many, one


def stream_gaps(url: str, n: int) -> list[float]:
    times = []
    with httpx.stream("POST", url + "/completion", timeout=600,
                      json={"prompt": "The quick brown fox", "n_predict": n, "stream": True,
                            "temperature": 0, "ignore_eos": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                times.append(time.perf_counter())
    return [b - a for a, b in zip(times[1:], times[2:])]


def main() -> None:
    from fixtures.build import ensure

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="an embedding encoder (default: the tiny-bert fixture)")
    ap.add_argument("--chat", help="a chat checkpoint (default: the tiny fixture)")
    ap.add_argument("--inputs", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--stream-tokens", type=int, default=64)
    args = ap.parse_args()
    model = Path(args.model) if args.model else ensure("tiny-bert")
    chat = Path(args.chat) if args.chat else ensure("tiny")
    inputs = _inputs(model, args.inputs, args.tokens)
    n = len(inputs)

    srv = ServerProcess(model, "--embeddings", "--no-warmup").start()
    try:
        many, one = server_side(srv.url, inputs, args.rounds)
    finally:
        srv.stop()
    raw = direct(model, inputs, args.rounds)
    print(f"encoder {model.name}: {n} inputs x {args.tokens} tokens")
    print(f"  direct, one MLX batch     {n / raw:10.1f} inputs/s")
    print(f"  server, one request       {n / many:10.1f} inputs/s   {raw / many:5.2f}x direct")
    print(f"  server, one input at once {n / one:10.1f} inputs/s   {many / one:5.2f}x the batch")

    srv = ServerProcess(chat, "--embedding-model", str(model), "-np", "1",
                        "--no-warmup").start()
    try:
        stream_gaps(srv.url, 8)  # warm
        alone = stream_gaps(srv.url, args.stream_tokens)
        stop = threading.Event()

        def load():
            while not stop.is_set():
                httpx.post(srv.url + "/v1/embeddings", json={"input": inputs}, timeout=600)

        worker = threading.Thread(target=load, daemon=True)
        worker.start()
        time.sleep(0.2)
        loaded = stream_gaps(srv.url, args.stream_tokens)
        stop.set()
        worker.join(600)
    finally:
        srv.stop()
    def stats(gaps):
        q = statistics.quantiles(gaps, n=10)
        return statistics.median(gaps) * 1e3, q[-1] * 1e3, max(gaps) * 1e3

    print(f"chat {chat.name} beside it, inter-token gap (median / p90 / max, ms):")
    print("  alone                  %8.2f %8.2f %8.2f" % stats(alone))
    print("  under embedding load   %8.2f %8.2f %8.2f" % stats(loaded))
    print("  (a gap under load is at most one embedding chunk: -b tokens of inputs)")


if __name__ == "__main__":
    main()

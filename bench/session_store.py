"""--session-store redis://: what sharing sessions between replicas costs.

    python bench/session_store.py                   # tiny fixture, ~1 min
    python bench/session_store.py --fixture bench   # the Qwen3-0.6B-shaped fixture
    python bench/session_store.py --model DIR

Starts a valkey-server / redis-server (no persistence), then:
0. publish overhead, in this process under trio: --streams producers each
   publish --frames 200-byte frames, (a) one worker-thread hop and one XADD
   per frame (the naive use of redis-py's sync client), (b) the server's
   writer (sessions/shared.py: every session's pending chunks in one
   pipelined round trip per flush); wall microseconds per frame;
and with two servers (A, B) sharing it:
1. resume latency: a long X-Conversation-Id stream runs on A; a client
   reconnects (`GET /v1/stream?conv_id=&from=N`, N = the bytes it holds)
   through A (same replica) and through B (the other one), alternating,
   --resumes times each; reported: request sent -> first resumed byte,
   median and p90, and the ratio B / A;
2. decode throughput at --streams concurrent X-Conversation-Id streams of
   --tokens tokens: on A (redis store) and, after A and B stop, on one
   server with the in-process store (memory); tokens / wall seconds over
   the whole batch, --rounds rounds alternating the order, medians; the
   ratio redis / memory (target >= 0.95).
Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import ServerProcess
from tests.store_server import StoreServer

HEADER = "X-Conversation-Id"
PROMPT = "Once upon a time, in a land far away,"


def first_byte_s(url: str, conv: str, offset: int) -> float:
    t0 = time.perf_counter()
    with httpx.Client(timeout=60) as c, c.stream(
            "GET", url + "/v1/stream", params={"conv_id": conv, "from": offset}) as r:
        r.raise_for_status()
        for chunk in r.iter_raw():
            if chunk:
                return time.perf_counter() - t0
    raise RuntimeError("the stream ended before a resumed byte")


def resume_latency(a: str, b: str, n: int) -> dict[str, list[float]]:
    conv = f"bench-{uuid.uuid4()}"
    body = {"prompt": PROMPT, "n_predict": -1, "temperature": 0, "ignore_eos": True,
            "stream": True}
    got = {"same replica (A)": [], "other replica (B)": []}
    with httpx.Client(timeout=60) as c, c.stream("POST", a + "/completion", json=body,
                                                  headers={HEADER: conv}) as r:
        it = r.iter_raw()
        held = len(next(it))
        for i in range(2 * n):
            for chunk in it:      # keep up with the live stream, then cut in
                held += len(chunk)
                break
            name, url = (("same replica (A)", a), ("other replica (B)", b))[i % 2]
            # resuming at the live edge: the first byte is the next frame
            got[name].append(first_byte_s(url, conv, max(0, held - 64)))
    httpx.delete(a + "/v1/stream", params={"conv_id": conv}, timeout=10)
    return got


def decode_rate(url: str, streams: int, tokens: int) -> float:
    barrier = threading.Barrier(streams)
    counts = [0] * streams

    def one(i: int) -> None:
        body = {"prompt": f"{PROMPT} {i}", "n_predict": tokens, "temperature": 0,
                "ignore_eos": True, "stream": True}
        barrier.wait()
        with httpx.Client(timeout=600) as c, c.stream(
                "POST", url + "/completion", json=body,
                headers={HEADER: f"rate-{i}-{uuid.uuid4()}"}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    counts[i] += 1

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def publish_overhead(url: str, streams: int, frames: int) -> dict[str, float]:
    import redis
    import trio

    from mlxcel_trio.server.sessions.shared import SharedStore

    frame = b"data: " + b"x" * 192 + b"\n\n"
    out: dict[str, float] = {}

    async def naive() -> None:
        client = redis.Redis.from_url(url)

        async def producer(i: int) -> None:
            for k in range(frames):
                await trio.to_thread.run_sync(
                    lambda: client.xadd(f"bench:naive:{i}", {"d": frame}))
        t0 = trio.current_time()
        async with trio.open_nursery() as n:
            for i in range(streams):
                n.start_soon(producer, i)
        out["(a) thread hop + XADD per frame"] = (trio.current_time() - t0) / (streams * frames)
        client.delete(*[f"bench:naive:{i}" for i in range(streams)])

    async def batched() -> None:
        store = SharedStore(url, stream_ttl_s=60, max_bytes=4 << 20)
        async with trio.open_nursery() as n:
            await n.start(store.run)
            gens = [(await store.open_stream(0, f"bench-{i}"))[0] for i in range(streams)]
            landed = trio.Semaphore(0)

            async def producer(i: int) -> None:
                for k in range(frames):
                    store.queue(gens[i], 0, f"bench-{i}", k * len(frame), frame,
                                then=lambda ok: landed.release())
                    await trio.sleep(0)     # frames arrive one by one, as from the engine
            t0 = trio.current_time()
            async with trio.open_nursery() as p:
                for i in range(streams):
                    p.start_soon(producer, i)
            for _ in range(streams * frames):
                await landed.acquire()
            out["(b) batched writer (the server's)"] = (trio.current_time() - t0) / (
                streams * frames)
            n.cancel_scope.cancel()

    trio.run(naive)
    trio.run(batched)
    return out


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixture", default="tiny")
    ap.add_argument("--model")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--resumes", type=int, default=20)
    ap.add_argument("--frames", type=int, default=500)
    args = ap.parse_args()
    if args.model:
        model = Path(args.model)
    else:
        from fixtures.build import ensure
        model = ensure(args.fixture)
    store = StoreServer().start()
    print(f"publish overhead, {args.streams} producers x {args.frames} frames:")
    for name, s in publish_overhead(store.url, args.streams, args.frames).items():
        print(f"  {name:36s} {s * 1e6:8.1f} us/frame")
    common = ("-c", str(args.streams * (args.tokens + 64) + 1024), "-np", str(args.streams))
    try:
        a = ServerProcess(model, *common, "--session-store", store.url).start()
        b = ServerProcess(model, *common, "--session-store", store.url).start()
        try:
            lat = resume_latency(a.url, b.url, args.resumes)
            print(f"resume latency (request sent -> first resumed byte), {args.resumes} each:")
            for name, xs in lat.items():
                print(f"  {name:18s} median {statistics.median(xs) * 1e3:7.2f} ms   "
                      f"p90 {pct(xs, 0.9) * 1e3:7.2f} ms")
            ratio = statistics.median(lat["other replica (B)"]) / statistics.median(
                lat["same replica (A)"])
            print(f"  ratio other / same: {ratio:.2f}x")
            decode_rate(a.url, args.streams, 8)                      # warm-up
            redis_rates = []
            for _ in range(args.rounds):
                redis_rates.append(decode_rate(a.url, args.streams, args.tokens))
        finally:
            a.stop()
            b.stop()
        m = ServerProcess(model, *common).start()
        try:
            decode_rate(m.url, args.streams, 8)
            memory_rates = [decode_rate(m.url, args.streams, args.tokens)
                            for _ in range(args.rounds)]
        finally:
            m.stop()
    finally:
        store.stop()
    r, mem = statistics.median(redis_rates), statistics.median(memory_rates)
    print(f"decode, {args.streams} X-Conversation-Id streams x {args.tokens} tokens, "
          f"{args.rounds} rounds (median; all rounds):")
    print(f"  redis store    {r:8.1f} tok/s   {[round(x, 1) for x in redis_rates]}")
    print(f"  memory store   {mem:8.1f} tok/s   {[round(x, 1) for x in memory_rates]}")
    print(f"  ratio redis / memory: {r / mem:.3f}x (target >= 0.95)")


if __name__ == "__main__":
    main()

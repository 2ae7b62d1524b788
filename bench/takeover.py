"""--session-store file://DIR: how fast a killed server's stream continues,
and what recording the log costs on the decode path.

    python bench/takeover.py                    # tiny fixture, about 1-2 min
    python bench/takeover.py --fixture trained  # or --model DIR
    python bench/takeover.py --store redis      # 1. through a second replica
    python bench/takeover.py --acceptance       # 3. and 4. only, about 2-4 min

1. death -> first continued byte, --kills times: a server streams a long
   greedy /completion with X-Conversation-Id; the client keeps the first
   bytes, the server is SIGKILLed, a new one starts on the same DIR, and the
   client resumes (`GET /v1/stream?conv_id=&from=N`, retried while the new
   server is not yet listening); reported: kill -> first byte past N
   (process start and model load included), median and p99, and the new
   server's own claim -> first continued byte (its /metrics summary);
2. decode throughput at --streams concurrent X-Conversation-Id streams of
   --tokens tokens on one server with memory (no log) and one with
   file://DIR (the log with token ids and the request record), --rounds
   rounds alternating the order, medians; the ratio file / memory (the
   recording's cost: within noise means about 1.0).
   With --store redis (a throwaway redis-server on a free port) 1. is
   measured through a second replica: two replicas share the store, the
   owner is SIGKILLed, and the client resumes through the survivor, which
   claims the session at its first scan (once a second, at most a third
   of --replica-ttl seconds, default 3; 10 is the server's default) after
   the owner's store connections closed, before the owner's heartbeat key
   lapses, so the figure is up to one scan interval plus the claim;
3. (--acceptance, Redis) --kill-streams (20) concurrent greedy streams
   (/completion, chat, /v1/completions, a grammar, a seeded sampler) on
   the owner, each client cut at a random byte offset, the owner SIGKILLed
   at a random moment after: how many streams the survivor continued and
   how many came out frame for frame equal (ids and timings aside) to an
   uninterrupted run;
4. (--acceptance, Redis) a rolling restart under --rolling-streams (8):
   SIGTERM on A (its streams handed to B), A restarted, SIGTERM on B (its
   streams handed to A): how many streams came out equal.
Both sides are this server, so the ratio is the measurement; raw mlx-lm
has no store to compare against.  Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import free_port, quantile, server_env, start_server  # noqa: E402
from bench.session_store import HEADER, PROMPT, decode_rate  # noqa: E402
from mlxcel_trio import store_url  # noqa: E402
from mlxcel_trio.server.sessions.file_store import read_log  # noqa: E402


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


def one_kill(model: Path, store: str, env: dict, tokens: int) -> tuple[float, float]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["--host", "127.0.0.1", "--session-store", store, "--metrics"]
    first = start_server(model, port, args, env)
    conv = f"bench-{uuid.uuid4()}"
    body = {"prompt": PROMPT, "n_predict": tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "cache_prompt": False}
    have = b""
    with httpx.Client(timeout=60) as c, c.stream("POST", url + "/completion", json=body,
                                                  headers={HEADER: conv}) as r:
        for chunk in r.iter_raw():
            have += chunk
            if len(have) >= 500:
                break
    first.send_signal(signal.SIGKILL)
    t_kill = time.perf_counter()
    first.wait(10)
    # the log ran past the client's bytes before the kill: continued bytes start at its end
    (path,) = glob.glob(os.path.join(store_url.file_dir(store), "*.log"))
    published = read_log(path, 1 << 30).total
    second = start_server_nowait(model, port, args, env)
    try:
        while True:
            try:
                with httpx.Client(timeout=60) as c, c.stream(
                        "GET", url + "/v1/stream",
                        params={"conv_id": conv, "from": published}) as r:
                    if r.status_code == 200:
                        for chunk in r.iter_raw():
                            if chunk:
                                took = time.perf_counter() - t_kill
                                break
                        else:
                            raise SystemExit("the resumed stream ended with no byte")
                        break
            except httpx.TransportError:
                pass
            if time.perf_counter() - t_kill > 120:
                raise SystemExit("no continuation within 120 s")
            time.sleep(0.02)
        own = _claim_to_first(url)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)
    return took, own


def _claim_to_first(url: str) -> float:
    """The continuing server's own claim -> first continued byte (its /metrics)."""
    name = "mlxcel_stream_takeover_first_token_seconds"
    deadline = time.monotonic() + 30
    while not _metric(url, name + "_count") >= 1:
        if time.monotonic() > deadline:
            raise SystemExit("the continuing server counted no takeover")
        time.sleep(0.02)
    return _metric(url, name + "_sum")


def start_server_nowait(model: Path, port: int, args: list[str], env: dict):
    import subprocess
    return subprocess.Popen([sys.executable, "-m", "mlxcel_trio", "-m", str(model),
                             "--port", str(port), "-np", "1", *args],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# -- with Redis: two replicas -------------------------------------------------------------

GREEDY = {"temperature": 0, "ignore_eos": True, "stream": True, "cache_prompt": False}
VOLATILE = {"id", "created", "created_at", "completed_at", "timings", "system_fingerprint",
            "id_slot"}


class Redis:
    """A throwaway redis-server (or valkey-server) on a free port, no persistence."""

    def __init__(self) -> None:
        binary = shutil.which("valkey-server") or shutil.which("redis-server")
        if binary is None:
            raise SystemExit("--store redis needs valkey-server or redis-server")
        import redis
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen([binary, "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=self.port, socket_timeout=1).ping()
                return
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise SystemExit("redis-server did not start")
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _stop(proc) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def case(i: int, tokens: int) -> tuple[str, dict]:
    """The i-th stream of an acceptance run: five kinds, prompts told apart."""
    prompt = f"{PROMPT} {i}"
    kind = i % 5
    if kind == 1:
        return "/v1/chat/completions", {"model": "m", "max_tokens": tokens, **GREEDY,
                                        "messages": [{"role": "user", "content": prompt}]}
    if kind == 2:
        return "/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": tokens,
                                   **GREEDY}
    body = {"prompt": prompt, "n_predict": tokens, **GREEDY}
    if kind == 3:
        body["grammar"] = 'root ::= ("ab" | "cd" | " " | "e")+'
    if kind == 4:
        body.update(temperature=0.9, seed=1000 + i)
    return "/completion", body


def read(method: str, url: str, cut: float = float("inf"), **kw) -> tuple[bytes, bool]:
    """A stream's bytes, the connection closed after `cut`; (bytes, it ended)."""
    got = b""
    with httpx.Client(timeout=120) as c, c.stream(method, url, **kw) as r:
        if r.status_code != 200:
            raise SystemExit(f"{method} {url}: {r.status_code} {r.read()[:200]!r}")
        for chunk in r.iter_raw():
            got += chunk
            if len(got) >= cut:
                return got[:int(cut)], False
    return got, True


def resume(url: str, conv: str, offset: int, cut: float = float("inf")) -> tuple[bytes, bool]:
    return read("GET", url + "/v1/stream", cut, params={"conv_id": conv, "from": offset})


def comparable(raw: bytes) -> list:
    def strip(obj):
        if isinstance(obj, dict):
            return {k: strip(v) for k, v in obj.items() if k not in VOLATILE}
        if isinstance(obj, list):
            return [strip(v) for v in obj]
        return obj
    return [strip(json.loads(b[6:])) if b.startswith(b"data: {") else b
            for b in raw.split(b"\n\n") if b.strip()]


def each(fn, items) -> list:
    """fn over items, one thread each (concurrent clients)."""
    out: list = [None] * len(items)

    def run(i: int) -> None:
        out[i] = fn(items[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def replica_args(store: str, streams: int) -> list[str]:
    return ["--host", "127.0.0.1", "-c", str(2048 * streams), "-np", str(streams),
            "--session-store", store, "--metrics"]


def redis_kill(model: Path, env: dict, tokens: int) -> tuple[float, float]:
    """1. through a second replica: owner SIGKILLed, the client resumes through the survivor."""
    store = Redis()
    pa, pb = free_port(), free_port()
    args = replica_args(store.url, 1)
    a = start_server(model, pa, args, env)
    b = start_server(model, pb, args, env)
    try:
        conv = f"bench-{uuid.uuid4()}"
        path, body = "/completion", {"prompt": PROMPT, "n_predict": tokens, **GREEDY}
        have, _ = read("POST", f"http://127.0.0.1:{pa}{path}", 500, json=body,
                       headers={HEADER: conv})
        a.send_signal(signal.SIGKILL)
        t_kill = time.perf_counter()
        a.wait(10)
        # the owner published past the client's bytes: continued bytes start at the store's end
        (info,) = httpx.post(f"http://127.0.0.1:{pb}/v1/streams/lookup",
                             json={"conversation_ids": [conv]}, timeout=10).json()
        took = None
        with httpx.Client(timeout=120) as c, c.stream(
                "GET", f"http://127.0.0.1:{pb}/v1/stream",
                params={"conv_id": conv, "from": info["total_bytes"]}) as r:
            for chunk in r.iter_raw():
                if chunk:
                    took = time.perf_counter() - t_kill
                    break
        if took is None:
            raise SystemExit("the resumed stream ended with no byte")
        return took, _claim_to_first(f"http://127.0.0.1:{pb}")
    finally:
        _stop(a)
        _stop(b)
        store.stop()


def kill_acceptance(model: Path, env: dict, streams: int, tokens: int, seed: int) -> str:
    """3.: every stream cut at a random offset, the owner killed at a random moment."""
    rng = random.Random(seed)
    store = Redis()
    pa, pb = free_port(), free_port()
    a = start_server(model, pa, replica_args(store.url, streams), env)
    b = start_server(model, pb, replica_args(store.url, streams), env)
    try:
        cases = [case(i, tokens) for i in range(streams)]
        ref = [read("POST", f"http://127.0.0.1:{pb}{p}", json=body)[0] for p, body in cases]
        convs = [f"accept-{i}-{uuid.uuid4()}" for i in range(streams)]
        cuts = [rng.randint(150, 3000) for _ in range(streams)]
        have = each(lambda i: read("POST", f"http://127.0.0.1:{pa}{cases[i][0]}", cuts[i],
                                   json=cases[i][1], headers={HEADER: convs[i]}),
                    list(range(streams)))
        time.sleep(rng.uniform(0.0, 0.5))   # a random moment: the streams stand apart
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        ended_before = sum(1 for _, ended in have if ended)
        tails = each(lambda i: resume(f"http://127.0.0.1:{pb}", convs[i], len(have[i][0])),
                     list(range(streams)))
        equal = sum(1 for i in range(streams)
                    if tails[i][1] and comparable(have[i][0] + tails[i][0]) == comparable(ref[i]))
        continued = _metric(f"http://127.0.0.1:{pb}",
                            'mlxcel_stream_takeovers_total{outcome="continued"}')
        return (f"{streams} streams, owner SIGKILLed at random points: {equal}/{streams} equal "
                f"to the uninterrupted run, {continued:.0f} continued by the survivor, "
                f"{ended_before} had ended before the kill")
    finally:
        _stop(a)
        _stop(b)
        store.stop()


def rolling_acceptance(model: Path, env: dict, streams: int, tokens: int) -> str:
    """4.: SIGTERM A, restart it, SIGTERM B, under live streams."""
    store = Redis()
    pa, pb = free_port(), free_port()
    args = replica_args(store.url, streams)
    a = start_server(model, pa, args, env)
    b = start_server(model, pb, args, env)
    a2 = None
    try:
        cases = [case(i, tokens) for i in range(streams)]
        ref = [read("POST", f"http://127.0.0.1:{pb}{p}", json=body)[0] for p, body in cases]
        convs = [f"rolling-{i}-{uuid.uuid4()}" for i in range(streams)]
        have = [read("POST", f"http://127.0.0.1:{pa}{p}", 200, json=body,
                     headers={HEADER: convs[i]})[0] for i, (p, body) in enumerate(cases)]
        t0 = time.perf_counter()
        _stop(a)
        a_exit = time.perf_counter() - t0
        a2 = start_server(model, pa, args, env)
        for i in range(streams):   # read a little through B, which holds them now
            have[i] += resume(f"http://127.0.0.1:{pb}", convs[i], len(have[i]), 100)[0]
        _stop(b)
        tails = each(lambda i: resume(f"http://127.0.0.1:{pa}", convs[i], len(have[i])),
                     list(range(streams)))
        equal = sum(1 for i in range(streams)
                    if tails[i][1] and comparable(have[i] + tails[i][0]) == comparable(ref[i]))
        return (f"rolling restart (SIGTERM A, restart A, SIGTERM B) under {streams} streams: "
                f"{equal}/{streams} equal to the uninterrupted run, A's SIGTERM exit "
                f"{a_exit:.1f} s")
    finally:
        _stop(a)
        _stop(b)
        if a2 is not None:
            _stop(a2)
        store.stop()


def rate_with(model: Path, store: str, env: dict, streams: int, tokens: int) -> float:
    port = free_port()
    proc = start_server(model, port, ["--host", "127.0.0.1", "-np", str(streams),
                                      "--session-store", store], env)
    try:
        return decode_rate(f"http://127.0.0.1:{port}", streams, tokens)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixture", default="tiny")
    ap.add_argument("--model", type=Path)
    ap.add_argument("--store", choices=("file", "redis"), default="file")
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replica-ttl", type=float, default=3.0)
    ap.add_argument("--acceptance", action="store_true")
    ap.add_argument("--kill-streams", type=int, default=20)
    ap.add_argument("--rolling-streams", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.model is None:
        from fixtures.build import ensure
        model = ensure(args.fixture)
    else:
        model = args.model
    env = server_env("bundled")
    if args.acceptance:
        ttl = {**env, "MLXCEL_INTERNAL_REPLICA_TTL_S": str(args.replica_ttl)}
        print(kill_acceptance(model, ttl, args.kill_streams, args.tokens, args.seed))
        print(rolling_acceptance(model, env, args.rolling_streams, args.tokens))
        return
    with tempfile.TemporaryDirectory() as tmp:
        took, own = [], []
        for i in range(args.kills):
            if args.store == "redis":
                ttl = {**env, "MLXCEL_INTERNAL_REPLICA_TTL_S": str(args.replica_ttl)}
                t, o = redis_kill(model, ttl, 4000)
            else:
                t, o = one_kill(model, f"file://{os.path.join(tmp, f'kill-{i}')}", env, 4000)
            took.append(t)
            own.append(o)
        where = (f"through the survivor, replica TTL {args.replica_ttl:g} s"
                 if args.store == "redis" else "restart and load included")
        print(f"death -> first continued byte ({args.kills} kills, {args.store}, {where}): "
              f"median {statistics.median(took) * 1000:.0f} ms, "
              f"p99 {quantile(took, 0.99) * 1000:.0f} ms")
        print(f"  the continuing server's claim -> first continued byte: median "
              f"{statistics.median(own) * 1000:.1f} ms, p99 {quantile(own, 0.99) * 1000:.1f} ms")
        if args.rounds < 1:
            return
        rates: dict[str, list[float]] = {"memory": [], args.store: []}
        for r in range(args.rounds):
            order = ("memory", args.store) if r % 2 == 0 else (args.store, "memory")
            for kind in order:
                if kind == "memory":
                    rates[kind].append(rate_with(model, "memory", env, args.streams,
                                                 args.tokens))
                elif kind == "file":
                    rates[kind].append(rate_with(model, f"file://{tmp}/rate-{r}", env,
                                                 args.streams, args.tokens))
                else:
                    store = Redis()
                    try:
                        rates[kind].append(rate_with(model, store.url, env, args.streams,
                                                     args.tokens))
                    finally:
                        store.stop()
        mem, other = statistics.median(rates["memory"]), statistics.median(rates[args.store])
        print(f"decode, {args.streams} streams x {args.tokens} tokens, {args.rounds} rounds: "
              f"memory {mem:.0f} frames/s, {args.store} {other:.0f} frames/s, "
              f"{args.store} / memory {other / mem:.3f}  (rounds: memory "
              f"{[round(x) for x in rates['memory']]}, {args.store} "
              f"{[round(x) for x in rates[args.store]]})")


if __name__ == "__main__":
    main()

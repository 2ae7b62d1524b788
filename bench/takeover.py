"""--session-store file://DIR: how fast a killed server's stream continues,
and what recording the log costs on the decode path.

    python bench/takeover.py                    # tiny fixture, about 1-2 min
    python bench/takeover.py --fixture trained  # or --model DIR

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
Both sides are this server, so the ratio is the measurement; raw mlx-lm
has no store to compare against.  Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import free_port, quantile, server_env, start_server  # noqa: E402
from bench.session_store import HEADER, PROMPT, decode_rate  # noqa: E402


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
    second = start_server_nowait(model, port, args, env)
    try:
        while True:
            try:
                with httpx.Client(timeout=60) as c, c.stream(
                        "GET", url + "/v1/stream",
                        params={"conv_id": conv, "from": len(have)}) as r:
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
        own = _metric(url, "mlxcel_stream_takeover_first_token_seconds_sum")
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)
    return took, own


def start_server_nowait(model: Path, port: int, args: list[str], env: dict):
    import subprocess
    return subprocess.Popen([sys.executable, "-m", "mlxcel_trio", "-m", str(model),
                             "--port", str(port), "-np", "1", *args],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


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
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.model is None:
        from fixtures.build import ensure
        model = ensure(args.fixture)
    else:
        model = args.model
    env = server_env("bundled")
    with tempfile.TemporaryDirectory() as tmp:
        took, own = [], []
        for i in range(args.kills):
            store = f"file://{os.path.join(tmp, f'kill-{i}')}"
            t, o = one_kill(model, store, env, 4000)
            took.append(t)
            own.append(o)
        print(f"death -> first continued byte ({args.kills} kills, restart and load included): "
              f"median {statistics.median(took) * 1000:.0f} ms, "
              f"p99 {quantile(took, 0.99) * 1000:.0f} ms")
        print(f"  the new server's claim -> first continued byte: median "
              f"{statistics.median(own) * 1000:.1f} ms, p99 {quantile(own, 0.99) * 1000:.1f} ms")
        rates: dict[str, list[float]] = {"memory": [], "file": []}
        for r in range(args.rounds):
            order = ("memory", "file") if r % 2 == 0 else ("file", "memory")
            for kind in order:
                store = "memory" if kind == "memory" else f"file://{tmp}/rate-{r}"
                rates[kind].append(rate_with(model, store, env, args.streams, args.tokens))
        mem, fil = statistics.median(rates["memory"]), statistics.median(rates["file"])
        print(f"decode, {args.streams} streams x {args.tokens} tokens, {args.rounds} rounds: "
              f"memory {mem:.0f} frames/s, file {fil:.0f} frames/s, file / memory "
              f"{fil / mem:.3f}  (rounds: memory {[round(x) for x in rates['memory']]}, "
              f"file {[round(x) for x in rates['file']]})")


if __name__ == "__main__":
    main()

"""--sleep-idle-seconds: time to sleep, wake latency, memory released.

    python bench/sleep_wake.py                    # tiny fixture, ~10 s
    python bench/sleep_wake.py --fixture bench    # the Qwen3-0.6B-shaped fixture
    python bench/sleep_wake.py --model DIR

Starts one `mlxcel-server -np 1 --sleep-idle-seconds W --metrics`, then:
1. two requests (same greedy prompt as every later one); the second's
   latency is the awake baseline;
2. the time from that request's end until /props reports is_sleeping
   (polled every --poll-ms), against the window W;
3. VmRSS of the server before and after it fell asleep, and the resident
   memory the engine measured around its own release
   (mlxcel_sleep_released_bytes);
4. the wake: the same request again, its latency, the reload time the
   engine reports (mlxcel_wake_load_seconds_total), VmRSS after, and one
   more request (the cost of the compiles the wake skipped shows as the gap).
Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import OPENBLAS, proc_status  # noqa: E402
from tests.conftest import ServerProcess  # noqa: E402

BODY = {"prompt": "The quick brown fox", "n_predict": 16, "temperature": 0, "ignore_eos": True}


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=60).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def timed_request(url: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = httpx.post(url + "/completion", json=BODY, timeout=600)
    r.raise_for_status()
    return time.perf_counter() - t0, r.json()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixture", default="tiny")
    ap.add_argument("--model")
    ap.add_argument("--window", type=float, default=2.0)
    ap.add_argument("--poll-ms", type=float, default=20)
    args = ap.parse_args()
    if args.model:
        model = Path(args.model)
    else:
        from fixtures.build import ensure
        model = ensure(args.fixture)
    env = {"LD_PRELOAD": OPENBLAS} if Path(OPENBLAS).exists() else {}
    srv = ServerProcess(model, "-np", "1", "--metrics", "--sleep-idle-seconds",
                        str(int(args.window)), env=env).start()
    url = srv.url
    try:
        timed_request(url)  # the first request after start-up pays its own compiles
        awake_s, first = timed_request(url)
        t_end = time.perf_counter()
        rss_awake = proc_status(srv.proc.pid)["VmRSS"]
        while not httpx.get(url + "/props", timeout=60).json()["is_sleeping"]:
            time.sleep(args.poll_ms / 1e3)
        to_sleep = time.perf_counter() - t_end
        time.sleep(0.5)  # let the allocator hand pages back before reading RSS
        rss_asleep = proc_status(srv.proc.pid)["VmRSS"]
        released = metric(url, "mlxcel_sleep_released_bytes")  # the engine's own RSS delta
        wake_s, again = timed_request(url)
        reload_s = metric(url, "mlxcel_wake_load_seconds_total")
        rss_woken = proc_status(srv.proc.pid)["VmRSS"]
        after_s, _ = timed_request(url)
    finally:
        srv.stop()
    same = again["content"] == first["content"]
    print(f"model: {model}  (window {args.window:g} s, poll {args.poll_ms:g} ms, "
          f"LD_PRELOAD={os.path.basename(env.get('LD_PRELOAD', '')) or '-'})")
    print(f"awake request latency      {awake_s * 1e3:9.0f} ms  (second request after start)")
    print(f"time to sleep after idle   {to_sleep:9.2f} s   (window {args.window:g} s)")
    print(f"wake request latency       {wake_s * 1e3:9.0f} ms  (reload {reload_s * 1e3:.0f} ms, "
          f"same output: {same}); the request after it {after_s * 1e3:.0f} ms")
    print(f"VmRSS awake / asleep / woken  {rss_awake / 1024:.0f} / {rss_asleep / 1024:.0f} / "
          f"{rss_woken / 1024:.0f} MiB  (released {(rss_awake - rss_asleep) / 1024:.0f} MiB; "
          f"the engine measured {released / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()

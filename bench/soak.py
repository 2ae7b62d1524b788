"""Soak: the stress mix at a steady rate for a long time, resources sampled.

    python bench/soak.py                                # 60 minutes, bench fixture, default flags
    python bench/soak.py --minutes 5 --fixture tiny     # a short proof run
    python bench/soak.py --store                        # with a session store (redis/valkey)
    python bench/soak.py --server-env MLXCEL_REQUEST_WATCHDOG_S=20   # the server's environment

A server with default flags (plus --metrics, and --session-store with
--store) serves bench/stress.py's mix from --clients clients, each at
--rate requests per second.  Every --sample-s seconds (60) the server's RSS
(split by what /metrics reports: the prompt cache's bytes, MLX's live
arrays and its buffer cache; the live arrays less the prompt cache, and
RSS less MLX's two, are series of their own), open file descriptors,
threads and trio tasks (counted from its SIGUSR2 task dump:
tests/diag/sitecustomize.py), the store's keys, the latency percentiles
of the small requests finished in that window (non-streamed completions
of at most SMALL tokens), and the engine's memory releases so far (count,
seconds, MiB given back; not plotted) are recorded.  At the end each
series' least-squares slope per hour is printed, with the ratio of the
last window's small-request p99 to the first's, and everything is written
to --out: soak.json and soak.png (one panel per series; drawn here with
zlib, no plotting library).  A breach of a request's bound (stress.py's
rule) is reported, with the stacks, as in stress.py.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import threading
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import stress  # noqa: E402

SMALL = 16   # a "small request": a non-streamed completion of at most this many tokens
SERIES = ("rss_mib", "cache_mib", "rss_rest_mib", "mlx_active_mib", "mlx_cache_mib",
          "mlx_live_rest_mib", "rss_outside_mlx_mib", "fds", "threads", "trio_tasks",
          "store_keys", "p50_small_s", "p99_small_s", "load1")
# /metrics families sampled: name in a row -> (family, divisor)
SCRAPED = {"cache_mib": ("mlxcel_prompt_cache_bytes", 2**20),
           "mlx_active_mib": ("mlxcel_mlx_active_bytes", 2**20),
           "mlx_cache_mib": ("mlxcel_mlx_cache_bytes", 2**20),
           # the engine's memory releases, cumulative (not plotted)
           "releases": ("mlxcel_memory_releases_total", 1),
           "release_s": ("mlxcel_memory_release_seconds_total", 1),
           "released_mib": ("mlxcel_memory_released_bytes_total", 2**20)}


def task_count(server) -> int | None:
    """Trio tasks in the server's SIGUSR2 dump (None when it gave none)."""
    from tests.diag.sitecustomize import TASKS_HEADER

    before = len(server.stderr)
    server.stacks()
    lines = server.stderr[before:]
    try:
        start = next(i for i, ln in enumerate(lines) if TASKS_HEADER in ln)
    except StopIteration:
        return None
    return sum(1 for ln in lines[start + 1:] if ln.lstrip().startswith("- "))


def scraped(url: str) -> dict[str, float | None]:
    """SCRAPED's families as /metrics reports them (None when the scrape
    fails or a family is absent)."""
    import httpx

    found: dict[str, float | None] = dict.fromkeys(SCRAPED)
    try:
        text = httpx.get(f"{url}/metrics", timeout=30.0).text
    except httpx.HTTPError:
        return found
    by_family = {family: (key, div) for key, (family, div) in SCRAPED.items()}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in by_family:
            key, div = by_family[name]
            found[key] = round(float(value) / div, 1 if div > 1 else 3)
    return found


def memory_split(rss: float, m: dict[str, float | None]) -> dict[str, float | None]:
    """RSS less the prompt cache (rss_rest_mib); MLX's live arrays less the
    prompt cache (the weights, the slots' KV, anything else alive); and RSS
    less MLX's live arrays and buffer cache (the process's heap, Python,
    what an allocator holds that MLX no longer counts)."""
    cache, active, mlx_cache = m["cache_mib"], m["mlx_active_mib"], m["mlx_cache_mib"]
    known = active is not None and mlx_cache is not None
    return {"rss_rest_mib": None if cache is None else round(rss - cache, 1),
            "mlx_live_rest_mib": None if cache is None or active is None
            else round(active - cache, 1),
            "rss_outside_mlx_mib": round(rss - active - mlx_cache, 1) if known else None}


def server_env(pairs: list[str]) -> dict[str, str]:
    """--server-env K=V pairs as a dict; a pair without '=' is refused."""
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--server-env {pair!r}: expected KEY=VALUE")
        env[key] = value
    return env


def proc_sample(pid: int) -> dict:
    status = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "Threads"):
            status[key] = int(rest.split()[0])
    # utime + stime: how busy the server was (CPU-seconds; 2 per second is both cores)
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return {"rss_mib": status["VmRSS"] / 1024, "threads": status["Threads"],
            "fds": len(os.listdir(f"/proc/{pid}/fd")), "cpu_s": round(cpu_s, 1)}


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value), per hour."""
    pts = [(t, v) for t, v in points if v is not None]
    if len(pts) < 2:
        return None
    n = len(pts)
    mt = sum(t for t, _ in pts) / n
    mv = sum(v for _, v in pts) / n
    var = sum((t - mt) ** 2 for t, _ in pts)
    if var == 0:
        return None
    return sum((t - mt) * (v - mv) for t, v in pts) / var * 3600


# -- a PNG without a plotting library ------------------------------------------------

def _png(width: int, height: int, rows: list[bytearray]) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    raw = b"".join(b"\0" + bytes(r) for r in rows)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2,
                                                               0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def plot(samples: list[dict], path: Path, width: int = 640, panel: int = 90) -> None:
    """One panel per series, each scaled to its own range (its title and range
    are in soak.json; the panels are in SERIES order, top to bottom)."""
    series = [s for s in SERIES if any(x.get(s) is not None for x in samples)]
    height = panel * max(1, len(series))
    rows = [bytearray(b"\xff" * (3 * width)) for _ in range(height)]

    def put(x: int, y: int, rgb: tuple[int, int, int]) -> None:
        if 0 <= x < width and 0 <= y < height:
            rows[y][3 * x:3 * x + 3] = bytes(rgb)

    t_end = max((x["t_s"] for x in samples), default=1) or 1
    for k, name in enumerate(series):
        top = k * panel
        for x in range(width):           # the panel's frame
            put(x, top, (200, 200, 200))
        values = [(x["t_s"], x[name]) for x in samples if x.get(name) is not None]
        lo = min(v for _, v in values)
        hi = max(v for _, v in values)
        span = (hi - lo) or 1.0
        prev = None
        for t, v in values:
            px = int(t / t_end * (width - 1))
            py = top + panel - 6 - int((v - lo) / span * (panel - 12))
            if prev is not None:        # a line from the previous point
                steps = max(abs(px - prev[0]), abs(py - prev[1]), 1)
                for i in range(steps + 1):
                    put(prev[0] + (px - prev[0]) * i // steps,
                        prev[1] + (py - prev[1]) * i // steps, (30, 90, 200))
            for dx in (-1, 0, 1):
                for dy in (-1, 0, 1):
                    put(px + dx, py + dy, (200, 40, 40))
            prev = (px, py)
    path.write_bytes(_png(width, height, rows))


# -- the run ------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--sample-s", type=float, default=60.0)
    p.add_argument("--fixture", default="bench")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rate", type=float, default=0.5, help="requests per second per client")
    p.add_argument("--probe-s", type=float, default=0.0,
                   help="also send one small completion every this many seconds (0: none), "
                        "so that a slow rate still has small-request latencies in each window")
    p.add_argument("--store", action="store_true", help="serve with a session store")
    p.add_argument("--out", type=Path, default=Path("soak-out"))
    p.add_argument("--server-args", default="",
                   help="more server options (e.g. '--cache-ram 256': a budget that fills early)")
    p.add_argument("--server-env", action="append", default=[], metavar="K=V",
                   help="an environment variable for the server process (repeatable)")
    p.add_argument("--blas", default="auto",
                   help="the server's --blas (default: the server's own default, auto; the "
                        "test harness's bundled BLAS is ~40x slower on the bench fixture)")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    from fixtures.build import ensure
    from tests.conftest import ServerProcess

    store = None
    args = ["--metrics", *a.server_args.split()]
    if a.store:
        from tests.store_server import StoreServer
        store = StoreServer().start()
        args += ["--session-store", store.url]
    env = {"MLXCEL_BLAS": a.blas, **server_env(a.server_env)}
    srv = ServerProcess(ensure(a.fixture), *args, env=env).start()
    try:
        return run(a, srv, store)
    finally:
        srv.stop()
        if store is not None:
            store.stop()


def probe_loop(url: str, every_s: float, deadline: float, t_tok: float, clients: int,
               tally, watch, stop: threading.Event) -> None:
    """One small non-streamed completion (4 tokens) every `every_s` seconds,
    on a kept-alive connection, counted as a small request."""
    import httpx

    body = {"prompt": stress.PROMPT[:60], "n_predict": 4, "temperature": 0}
    with httpx.Client(base_url=url, timeout=300.0) as c:
        while time.monotonic() < deadline and not stop.is_set():
            started = time.monotonic()
            watch.begin("probe", stress.bound_for(4, t_tok, clients))
            try:
                r = c.post("/completion", json=body)
                status, ok = r.status_code, r.status_code == 200 and "content" in r.json()
            except (httpx.HTTPError, ValueError) as exc:
                status, ok = type(exc).__name__, False
            dumped = watch.end()
            elapsed = time.monotonic() - started
            o = stress.Outcome("probe", status, elapsed, stress.bound_for(4, t_tok, clients), ok)
            if tally.add(o) and not dumped:
                watch.dumper.dump(o)
            stop.wait(max(0.0, every_s - elapsed))


def run(a, srv, store) -> int:
    t_tok = stress.token_time(srv.url, stress.PROMPT)
    print(f"soak: {srv.url}, {a.clients} clients at {a.rate}/s each, {a.minutes} min; "
          f"lone token time {t_tok * 1000:.1f} ms", flush=True)
    tally = stress.Tally()
    watch = stress.InFlight(stress.Dumper(a.out, None, srv))
    stop = threading.Event()
    started = time.monotonic()
    deadline = started + a.minutes * 60
    mixes = [stress.Mix(srv.url, stress.PROMPT, False, 7000 + i) for i in range(a.clients)]
    threads = [threading.Thread(target=stress.client_loop, daemon=True, args=(
        m, deadline, t_tok, a.clients, tally, watch, stop, a.rate, started)) for m in mixes]
    for t in threads:
        t.start()
    if a.probe_s:
        threads.append(threading.Thread(target=probe_loop, daemon=True, args=(
            srv.url, a.probe_s, deadline, t_tok, a.clients, tally, watch, stop)))
        threads[-1].start()
    threading.Thread(target=watch.watch, args=(stop,), daemon=True).start()
    samples: list[dict] = []
    seen = 0

    def sample() -> None:
        nonlocal seen
        with tally.lock:
            window = tally.outcomes[seen:]
            seen = len(tally.outcomes)
        small = [o.elapsed_s for o in window if o.op in ("completion", "probe") and o.ok
                 and o.bound_s <= stress.bound_for(SMALL, t_tok, a.clients)]
        proc = proc_sample(srv.proc.pid)
        metrics = scraped(srv.url)
        row = {"t_s": round(time.monotonic() - started, 1), **proc, **metrics,
               **memory_split(proc["rss_mib"], metrics),
               "trio_tasks": task_count(srv),
               "store_keys": store.client().dbsize() if store is not None else None,
               "requests": len(window),
               "p50_small_s": percentile(small, 0.5), "p99_small_s": percentile(small, 0.99),
               # the machine's load: a p99 compared across windows means something
               # only where the load beside it was alike
               "load1": round(os.getloadavg()[0], 2)}
        samples.append(row)
        print(json.dumps(row), flush=True)

    sample()
    try:
        while time.monotonic() < deadline:
            time.sleep(min(a.sample_s, max(0.0, deadline - time.monotonic())))
            sample()
    except KeyboardInterrupt:
        pass
    stop.set()
    for t in threads:
        t.join(30)
    slopes = {name: slope_per_hour([(x["t_s"], x.get(name)) for x in samples])
              for name in SERIES}
    # a budget that fills early shows its plateau here, not in the whole run's slope
    half = samples[-1]["t_s"] / 2
    slopes_late = {name: slope_per_hour([(x["t_s"], x.get(name)) for x in samples
                                         if x["t_s"] >= half]) for name in SERIES}
    p99 = [x["p99_small_s"] for x in samples if x["p99_small_s"] is not None]
    report = {"minutes": a.minutes, "fixture": a.fixture, "blas": a.blas, "clients": a.clients,
              "server_args": a.server_args, "server_env": server_env(a.server_env),
              "rate_per_client": a.rate, "probe_s": a.probe_s, "requests": len(tally.outcomes),
              "breaches": len(tally.breaches), "failures": len(tally.failures),
              "failed": [o.__dict__ for o in tally.failures[:20]],   # what stress.py records
              "slope_per_hour": slopes, "slope_per_hour_second_half": slopes_late,
              "server_cpu_s_per_s": round((samples[-1]["cpu_s"] - samples[0]["cpu_s"])
                                          / max(1.0, samples[-1]["t_s"]), 3),
              "p99_small_end_over_start": (p99[-1] / p99[0]) if len(p99) >= 2 and p99[0] else None,
              "load1_start_end": [samples[1]["load1"], samples[-1]["load1"]]
              if len(samples) >= 2 else None,
              "samples": samples}
    (a.out / "soak.json").write_text(json.dumps(report, indent=1))
    plot(samples, a.out / "soak.png")
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=1))
    return 1 if tally.breaches or tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())

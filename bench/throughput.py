"""Server vs raw mlx-lm on the same checkpoint: decode rates, TTFT, disconnect
latency and peak memory.  A benchmark, not a test: it prints numbers and
ratios next to their targets and never fails on them.

    python bench/throughput.py [--model DIR | --fixture bench|tiny]
                               [--tokens 128] [--prompt-tokens 128]
                               [--blas auto|mkl|openblas|bundled|inherit]
                               [--rounds 1] [--quick] [--json OUT.json]

One run measures, on ONE checkpoint and with the SAME environment (BLAS
preload and threading variables passed identically to both processes):

1. single-stream decode tok/s: one streaming /completion vs mlx-lm
   `stream_generate` (greedy, same prompt ids, same max tokens), both as
   (n-1)/(t_last-t_first) from per-token timestamps; plus the server's own
   timings.predicted_per_second;
2. aggregate decode tok/s with 4 and 8 concurrent streams (server `-np 8`,
   distinct prompts, launched together) vs mlx-lm's `BatchGenerator` on the
   same prompts, both over the window where every stream is decoding;
3. time to first token: request sent -> first token frame vs
   prefill + first token of `stream_generate` for the same prompt;
4. disconnect -> slot freed (server `-np 1`): a long stream is dropped
   after a few frames and GET /slots is polled every 2 ms until the slot is
   free; compared with the per-token decode time;
5. peak resident memory (VmHWM) of the server vs a raw mlx-lm process (its
   own subprocess, which also produces the raw timings above).

See bench/README.md for how to read the output.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import _common as C  # noqa: E402

READY_LINE = "main: model loaded"
LOADAVG: list = []
TARGETS = {"single": 0.90, "agg8": 0.85, "slot_steps": 1.0, "memory": 1.15}


# -- environment -------------------------------------------------------------------

def child_env(mode: str) -> dict[str, str]:
    """The one environment both measured processes get."""
    env = C.blas_env(mode)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


# -- the server process ----------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model: Path, env: dict, *args: str, log_dir: Path,
                 trace: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        entry = [str(HERE / "trace_server.py")] if trace else ["-m", "mlxcel_trio"]
        self.argv = [sys.executable, *entry, "-m", str(model), "--host", "127.0.0.1",
                     "--port", str(self.port), *args]
        self.env = {**env, "MLXCEL_BENCH_TRACE": str(trace)} if trace else env
        self.log = log_dir / f"server-{self.port}.log"
        self.proc: subprocess.Popen | None = None
        self.load_s = None

    def start(self, timeout: float = 600) -> "Server":
        t0 = time.perf_counter()
        self._err = open(self.log, "w")
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=self._err,
                                     stdin=subprocess.DEVNULL, text=True, env=self.env, cwd=ROOT)
        ready = threading.Event()
        self.stdout: list[str] = []

        def pump():
            for line in self.proc.stdout:
                self.stdout.append(line)
                if line.startswith(READY_LINE):
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        ready.wait(timeout)
        if self.proc.poll() is not None or not any(l.startswith(READY_LINE) for l in self.stdout):
            self.stop()
            sys.exit(f"server did not become ready: {' '.join(self.argv)}\n"
                     f"stdout:\n{''.join(self.stdout)}\nstderr:\n{self.log.read_text()[-4000:]}")
        self.load_s = time.perf_counter() - t0
        return self

    def stop(self) -> None:
        C.stop_process(self.proc)
        if getattr(self, "_err", None):
            self._err.close()


def stream_once(url: str, prompt: list[int], n_predict: int, barrier=None,
                client: httpx.Client | None = None) -> dict:
    """One streaming /completion (bench/_common.py's), on its own client
    when none is given."""
    if client is not None:
        return C.stream_completion(url, prompt, n_predict, client, barrier)
    with httpx.Client(timeout=httpx.Timeout(3600, connect=30)) as own:
        return C.stream_completion(url, prompt, n_predict, own, barrier)


def concurrent(url: str, prompts: list[list[int]], n_predict: int) -> dict:
    barrier = threading.Barrier(len(prompts))
    results: list = [None] * len(prompts)
    clients = [httpx.Client(timeout=httpx.Timeout(3600, connect=30)) for _ in prompts]

    def run(i):
        try:
            results[i] = stream_once(url, prompts[i], n_predict, barrier, clients[i])
        except Exception as exc:  # reported, not raised: a benchmark never fails
            results[i] = {"error": repr(exc), "events": [], "ids": {}, "t_send": time.perf_counter()}

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in clients:
        c.close()
    origin = min(r["t_send"] for r in results)
    streams = [[(r["t_send"] - origin + t, n) for t, n in r["events"]] for r in results]
    errors = [r["error"] for r in results if "error" in r]
    return {"streams": streams, "ids": [r["ids"] for r in results], "errors": errors,
            "finals": [r.get("final") for r in results]}


# -- disconnect -> slot freed ----------------------------------------------------------

def disconnect_once(srv: Server, prompt: list[int], frames: int, rst: bool,
                    poll_s: float, bound_s: float, phase: float) -> dict:
    """Drop a long stream after `frames` frames plus `phase` of one decode
    step (so the close lands at a known point inside a step), then poll
    /slots until the slot is free."""
    body = json.dumps({"prompt": prompt, "n_predict": 100000, "temperature": 0,
                       "ignore_eos": True, "stream": True}).encode()
    head = (f"POST /completion HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(head + body)
    seen, stamps, buf = 0, [], b""
    while seen < frames:
        chunk = s.recv(65536)
        if not chunk:
            break
        now = time.perf_counter()
        buf += chunk
        k = buf.count(b"data: ")
        stamps.extend([now] * (k - seen))
        seen = k
    gaps = [b - a for a, b in zip(stamps[1:], stamps[2:])]  # token frames only
    delay = phase * C.median(gaps) if gaps else 0.0
    with httpx.Client(timeout=30) as poll:
        busy = poll.get(srv.url + "/slots").json()[0]["is_processing"]
        if not busy:
            print("warning: slot not busy before the disconnect", file=sys.stderr)
        time.sleep(max(0.0, stamps[-1] + delay - time.perf_counter()))
        if rst:  # abortive close: the peer gets RST instead of FIN
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        t_close = time.perf_counter()
        s.close()
        polls, rtts, freed = 0, [], None
        while time.perf_counter() - t_close < bound_s:
            t = time.perf_counter()
            busy = poll.get(srv.url + "/slots").json()[0]["is_processing"]
            now = time.perf_counter()
            polls += 1
            rtts.append(now - t)
            if not busy:
                freed = now - t_close
                break
            time.sleep(poll_s)
    return {"t_close": t_close, "phase": phase, "delay_s": delay, "freed_s": freed, "polls": polls, "poll_rtt_s": C.median(rtts),
            "frame_gap_s": C.median(gaps), "frames": seen}


def measure_disconnect(model: Path, env: dict, args, prompt: list[int], log_dir: Path) -> dict:
    ctx = max(8192, 4 * len(prompt))
    trace = log_dir / "trace.log" if args.trace else None
    srv = Server(model, env, "-np", "1", "-c", str(ctx), log_dir=log_dir, trace=trace).start()
    out: dict = {"ctx": ctx, "runs": {}}
    try:
        # Warm the stream path once (not measured).
        stream_once(srv.url, prompt, 2)
        for mode in ("fin", "rst"):
            runs = []
            n = args.disconnect_reps
            for i in range(n):
                runs.append(disconnect_once(srv, prompt, args.disconnect_frames, mode == "rst",
                                            args.poll_ms / 1e3, bound_s=60, phase=(i + 0.5) / n))
            out["runs"][mode] = runs
        out["blas"] = C.blas_in_use(srv.proc.pid)
    finally:
        srv.stop()
    if trace:
        lines = trace.read_text().splitlines()
        for runs in out["runs"].values():
            for r in runs:
                r["trace"] = trace_breakdown(lines, r)
    return out


TRACE_EVENTS = ("asgi.http.disconnect", "asgi.send.raised", "handle.close", "post:Cancel",
                "cancel.begin", "deliver:freed")


def trace_breakdown(lines: list[str], run: dict) -> dict:
    """Offsets (s) from the client's close to each trace point of the
    server (bench/trace_server.py), and where in the engine step the close
    fell: the BatchGenerator.next() calls bracketing it."""
    t_close = run["t_close"]
    end = t_close + (run["freed_s"] or 60) + 0.5
    first: dict = {}
    next_ends: list[float] = []
    for line in lines:
        t, _thread, event, *rest = line.split(" ", 3)
        t = float(t)
        detail = rest[0] if rest else ""
        if event == "gen.next.end":
            next_ends.append(t)
        if not (t_close <= t <= end):
            continue
        key = event
        if event == "post":
            key = f"post:{detail.strip()}"
        elif event == "deliver" and "freed=[]" not in detail:
            key = "deliver:freed"
        if key in TRACE_EVENTS and key not in first:
            first[key] = t - t_close
    before = [t for t in next_ends if t <= t_close]
    after = [t for t in next_ends if t > t_close]
    if before:
        first["last_step_end_before_close"] = before[-1] - t_close
    if after:
        first["next_step_end_after_close"] = after[0] - t_close
    return first


# -- one round -------------------------------------------------------------------

def run_raw(spec: dict, env: dict, log_dir: Path) -> dict:
    path = log_dir / "raw-spec.json"
    path.write_text(json.dumps(spec))
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, str(HERE / "_raw.py"), str(path)], env=env, cwd=ROOT,
                       capture_output=True, text=True)
    lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        sys.exit(f"raw mlx-lm worker failed (rc {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    out = json.loads(lines[-1][7:])
    out["wall_s"] = time.perf_counter() - t0
    return out


def run_server(model: Path, env: dict, spec: dict, log_dir: Path) -> dict:
    n_max = max(len(p) for ps in spec["batch_prompts"].values() for p in ps) + spec["tokens"] + 16
    n_slots = max([8] + [len(ps) for ps in spec["batch_prompts"].values()])
    ctx = n_slots * 256 * math.ceil(n_max / 256)
    srv = Server(model, env, "-np", str(n_slots), "-c", str(ctx), log_dir=log_dir).start()
    out: dict = {"ctx": ctx, "load_s": srv.load_s}
    try:
        pid = srv.proc.pid
        stream_once(srv.url, spec["warmup_prompt"], 4)
        out["cpu"], out["client_cpu"] = {}, {}

        def snap():
            return C.thread_cpu(pid), time.process_time()

        s0 = snap()
        r = stream_once(srv.url, spec["single_prompt"], spec["tokens"])
        s1 = snap()
        out["cpu"]["single"] = C.cpu_delta(s0[0], s1[0], pid)
        out["client_cpu"]["single"] = s1[1] - s0[1]
        out["single"] = {"events": r["events"], "ids": r["ids"],
                         "timings": (r["final"] or {}).get("timings")}
        out["batch"] = {}
        for key, prompts in spec["batch_prompts"].items():
            t0 = time.perf_counter()
            s0 = snap()
            c = concurrent(srv.url, prompts, spec["tokens"])
            s1 = snap()
            out["cpu"][key] = C.cpu_delta(s0[0], s1[0], pid)
            out["client_cpu"][key] = s1[1] - s0[1]
            c["wall_s"] = time.perf_counter() - t0
            out["batch"][key] = c
        out["memory_kib"] = C.proc_status(srv.proc.pid)
        out["blas"] = C.blas_in_use(srv.proc.pid)
        out["pid"] = srv.proc.pid
    finally:
        srv.stop()
    return out


# -- analysis -------------------------------------------------------------------------

def agreement(ref: list[int], got: dict) -> tuple[int, int]:
    """(tokens equal before the first difference, tokens compared); `got`
    maps 1-based token index -> id (frames withheld mid-UTF-8 are absent)."""
    keys = [n for n in sorted(got) if n - 1 < len(ref)]
    same = 0
    for n in keys:
        if ref[n - 1] != got[n]:
            break
        same += 1
    return same, len(keys)


def summarize(raw: dict, srv: dict) -> dict:
    s: dict = {}
    rs, ss = raw["single"], srv["single"]
    s["single_raw"] = C.single_rate(rs["events"])
    s["single_srv"] = C.single_rate(ss["events"])
    s["single_p25_raw"] = C.robust_rate([rs["events"]])
    s["single_p25_srv"] = C.robust_rate([ss["events"]])
    s["single_srv_timings"] = (ss.get("timings") or {}).get("predicted_per_second")
    s["step_raw"] = C.step_gap(rs["events"])
    s["step_srv"] = C.step_gap(ss["events"])
    s["ttft_raw"] = rs["events"][0][0] if rs["events"] else None
    s["ttft_srv"] = ss["events"][0][0] if ss["events"] else None
    s["prompt_n"] = rs["prompt_n"]
    s["prompt_n_srv"] = (ss.get("timings") or {}).get("prompt_n")
    s["prompt_ms_srv"] = (ss.get("timings") or {}).get("prompt_ms")
    s["agree_single"] = agreement(rs["tokens"], {int(k): v for k, v in ss["ids"].items()})
    for key in raw["batch"]:
        a_raw = C.aggregate_rate(raw["batch"][key]["events"])
        a_srv = C.aggregate_rate(srv["batch"][key]["streams"])
        s[f"agg{key}_raw"] = a_raw.get("rate")
        s[f"agg{key}_srv"] = a_srv.get("rate")
        s[f"agg{key}_p25_raw"] = C.robust_rate(raw["batch"][key]["events"])
        s[f"agg{key}_p25_srv"] = C.robust_rate(srv["batch"][key]["streams"])
        s[f"agg{key}_detail"] = {"raw": a_raw, "server": a_srv,
                                 "errors": srv["batch"][key]["errors"]}
        toks = sum(len(t) for t in raw["batch"][key]["tokens"])
        s[f"e2e{key}_raw"] = toks / raw["batch"][key]["wall_s"]
        srv_toks = sum(ev[-1][1] for ev in srv["batch"][key]["streams"] if ev)
        s[f"e2e{key}_srv"] = srv_toks / srv["batch"][key]["wall_s"]
        agree = [agreement(ref, {int(k): v for k, v in got.items()})
                 for ref, got in zip(raw["batch"][key]["tokens"], srv["batch"][key]["ids"])]
        s[f"agree{key}"] = (sum(a for a, _ in agree), sum(b for _, b in agree))
    s["foreign_raw"] = raw["foreign_cores"]
    s["foreign_srv"] = srv["foreign_cores"]
    s["hwm_raw_kib"] = raw["memory_kib"]["end"]["VmHWM"]
    s["hwm_srv_kib"] = srv["memory_kib"]["VmHWM"]
    return s


def ratio(a, b):
    return a / b if a and b else None


def fmt(x, spec=".2f", unit=""):
    return "-" if x is None else f"{x:{spec}}{unit}"


def verdict(r, target, higher_better=True):
    if r is None:
        return "n/a"
    ok = r >= target if higher_better else r <= target
    return "meets" if ok else "MISSES"


def report(args, model: Path, env: dict, rounds: list, disc: dict | None, cfg: dict) -> dict:
    print()
    print("=" * 96)
    print(f"checkpoint  {model}")
    print(f"            {cfg.get('model_type')} hidden={cfg.get('hidden_size')} "
          f"layers={cfg.get('num_hidden_layers')} vocab={cfg.get('vocab_size')} "
          f"dtype={cfg.get('torch_dtype', cfg.get('dtype', '?'))}"
          f"{' quantized' if cfg.get('quantization') else ''}")
    print(f"env         {C.blas_vars(env) or '{}'}")
    print(f"loadavg     start {LOADAVG[0]}, end {Path('/proc/loadavg').read_text().split()[:3]} "
          f"({os.cpu_count()} CPUs; other processes skew the numbers)")
    out: dict = {}
    step = None
    if rounds:
        out = report_throughput(args, rounds)
        step = out["medians"].get("step_srv")
    elif disc:
        print(f"BLAS        server: {disc['blas']['kind']}")
    if disc:
        out["disconnect"] = report_disconnect(args, disc, step)
    print("=" * 96)
    return out


def report_throughput(args, rounds: list) -> dict:
    sums = [summarize(r["raw"], r["server"]) for r in rounds]
    med = {k: C.median([s[k] for s in sums]) for k in sums[0]
           if isinstance(sums[0][k], (int, float)) or sums[0][k] is None}
    last = rounds[-1]
    print(f"workload    prompt {sums[0]['prompt_n']} tokens (server counted "
          f"{sums[0]['prompt_n_srv']}), {args.tokens} generated tokens per stream, "
          f"server ignore_eos, raw EOS {last['raw']['eos']['mode']} {last['raw']['eos']['ids']}, "
          f"{len(rounds)} round(s){' (medians)' if len(rounds) > 1 else ''}")
    print(f"BLAS        raw: {last['raw']['blas']['kind']}   server: {last['server']['blas']['kind']}")
    for lib in sorted(set(last["raw"]["blas"]["libs"]) | set(last["server"]["blas"]["libs"])):
        note = "  (numpy's own, not used by mlx)" if "scipy_openblas" in lib else ""
        print(f"            mapped: {lib}{note}")
    print("-" * 96)
    print(f"{'metric':44} {'raw mlx-lm':>11} {'server':>11} {'srv/raw':>8}  target")
    rows = [
        ("single-stream decode tok/s", "single", "{}", TARGETS["single"], True),
        ("  server timings.predicted_per_second", None, None, None, True),
        ("  from the p10 step time (contention-robust)", "single_p25", "{}", TARGETS["single"], True),
    ]
    keys = list(last["raw"]["batch"])
    for k in keys:
        target = TARGETS["agg8"] if k == "8" else None
        rows += [(f"aggregate decode tok/s, {k} streams", f"agg{k}", "{}", target, True),
                 ("  from the p10 step time (contention-robust)", f"agg{k}_p25", "{}", target, True)]
    rows += [(f"  end-to-end tok/s incl. prefill, {k} streams", f"e2e{k}", "{}", None, True)
             for k in keys]
    for label, key, _, target, hb in rows:
        if key is None:
            print(f"{label:44} {'':>11} {fmt(med.get('single_srv_timings')):>11}")
            continue
        a, b = med.get(f"{key}_raw"), med.get(f"{key}_srv")
        r = ratio(b, a)
        tgt = f">= {target:.2f}x  {verdict(r, target)}" if target else "(info)"
        print(f"{label:44} {fmt(a):>11} {fmt(b):>11} {fmt(r, '.2f', 'x'):>8}  {tgt}")
    a, b = med.get("foreign_raw"), med.get("foreign_srv")
    print(f"{'other processes, avg CPUs busy meanwhile':44} {fmt(a):>11} {fmt(b):>11}"
          f"{'':>10}(info: contention)")
    if len(sums) > 1:
        keys = list(last["raw"]["batch"])
        for i, sm in enumerate(sums):
            parts = [f"single {fmt(ratio(sm['single_srv'], sm['single_raw']), '.2f', 'x')}"]
            parts += [f"{k} streams {fmt(ratio(sm[f'agg{k}_srv'], sm[f'agg{k}_raw']), '.2f', 'x')}"
                      for k in keys]
            parts.append(f"TTFT {fmt(ratio(sm['ttft_srv'], sm['ttft_raw']), '.2f', 'x')}")
            print(f"  round {i + 1}: other processes {sm['foreign_raw']:.2f} / {sm['foreign_srv']:.2f} "
                  f"CPUs (raw / server); srv/raw " + ", ".join(parts))
    a, b = med.get("step_raw"), med.get("step_srv")
    print(f"{'per-token decode time ms, 1 stream':44} {fmt(a and a * 1e3, '.1f'):>11} "
          f"{fmt(b and b * 1e3, '.1f'):>11} {fmt(ratio(b, a), '.2f', 'x'):>8}  (info, lower is better)")
    a, b = med.get("ttft_raw"), med.get("ttft_srv")
    print(f"{'time to first token ms (' + str(sums[0]['prompt_n']) + '-token prompt)':44} "
          f"{fmt(a and a * 1e3, '.1f'):>11} {fmt(b and b * 1e3, '.1f'):>11} "
          f"{fmt(ratio(b, a), '.2f', 'x'):>8}  (info, lower is better)")
    if med.get("prompt_ms_srv"):
        print(f"{'  server timings.prompt_ms':44} {'':>11} {med['prompt_ms_srv']:>11.1f}")
    a, b = med.get("hwm_raw_kib"), med.get("hwm_srv_kib")
    r = ratio(b, a)
    print(f"{'peak RSS (VmHWM) MiB':44} {fmt(a and a / 1024, '.0f'):>11} "
          f"{fmt(b and b / 1024, '.0f'):>11} {fmt(r, '.2f', 'x'):>8}  "
          f"<= {TARGETS['memory']:.2f}x  {verdict(r, TARGETS['memory'], False)}")
    raw_mem = last["raw"]["memory_kib"]
    print(f"{'  raw RSS after imports / at end MiB':44} "
          f"{raw_mem['after_imports']['VmRSS'] / 1024:>5.0f} / {raw_mem['end']['VmRSS'] / 1024:<5.0f}"
          f"{'':>11}   mlx peak {last['raw']['mlx_peak_memory_bytes'] / 2**20:.0f} MiB")
    print("-" * 96)
    s0 = sums[-1]
    print(f"greedy agreement with raw (tokens equal before first difference / compared): "
          f"single {s0['agree_single'][0]}/{s0['agree_single'][1]}, "
          + ", ".join(f"{k} streams {s0['agree' + k][0]}/{s0['agree' + k][1]}"
                      for k in last["raw"]["batch"]))
    for k in last["raw"]["batch"]:
        d = s0[f"agg{k}_detail"]
        if d["errors"]:
            print(f"  {k} streams: server errors {d['errors']}")
        print(f"  {k} streams window: raw {d['raw'].get('window_tokens')} tok / "
              f"{fmt(d['raw'].get('window_s'), '.2f')} s, server {d['server'].get('window_tokens')} tok / "
              f"{fmt(d['server'].get('window_s'), '.2f')} s; step raw "
              f"{fmt((d['raw'].get('step_s') or 0) * 1e3, '.1f')} ms, server "
              f"{fmt((d['server'].get('step_s') or 0) * 1e3, '.1f')} ms")
    print("CPU seconds per phase (last round; process total / main thread / busiest threads; "
          "server phases also list the benchmark client's own CPU):")
    for k in ("single", *last["raw"]["batch"]):
        rc, sc = last["raw"]["cpu"][k], last["server"]["cpu"][k]
        rw = (last["raw"]["single"]["events"][-1][0] if k == "single"
              else last["raw"]["batch"][k]["wall_s"])
        sw = (last["server"]["single"]["events"][-1][0] if k == "single"
              else last["server"]["batch"][k]["wall_s"])
        print(f"  {k:>6}: raw {rc['total']:6.1f} s / {rc['main']:5.1f} / {rc['top']} in {rw:5.1f} s wall"
              f" ({rc['total'] / rw:.2f} cores);  server {sc['total']:6.1f} s / {sc['main']:5.1f} / "
              f"{sc['top']} in {sw:5.1f} s wall ({sc['total'] / sw:.2f} cores) + client "
              f"{last['server']['client_cpu'][k]:.1f} s")
    print(f"load: raw {last['raw']['load_s']:.1f} s (mlx_lm.load), server {last['server']['load_s']:.1f} s "
          f"(start -> ready, incl. warm-up); raw worker wall {last['raw']['wall_s']:.1f} s")
    return {"summaries": sums, "medians": med}




def report_disconnect(args, disc: dict, step: float | None) -> dict:
    print("-" * 96)
    print(f"disconnect -> slot freed (server -np 1, -c {disc['ctx']}, close after "
          f"{args.disconnect_frames} frames + a delay spread over one step, "
          f"GET /slots every {args.poll_ms:g} ms), {args.disconnect_reps} runs each:")
    out_disc = {}
    for mode, runs in disc["runs"].items():
        freed = [r["freed_s"] for r in runs if r["freed_s"] is not None]
        gap = C.median(r["frame_gap_s"] for r in runs)
        rtt = C.median(r["poll_rtt_s"] for r in runs)
        m, mx_ = C.median(freed), (max(freed) if freed else None)
        ref = gap or step
        steps_med, steps_max = ratio(m, ref), ratio(mx_, ref)
        out_disc[mode] = {"median_s": m, "max_s": mx_, "step_s": ref, "poll_rtt_s": rtt,
                          "unfreed": len(runs) - len(freed), "runs": runs}
        label = {"fin": "close (FIN)", "rst": "abort (RST)"}[mode]
        print(f"  {label:12} median {fmt(m and m * 1e3, '.1f')} ms, max "
              f"{fmt(mx_ and mx_ * 1e3, '.1f')} ms; decode step here "
              f"{fmt(ref and ref * 1e3, '.1f')} ms -> median {fmt(steps_med, '.2f')} / max "
              f"{fmt(steps_max, '.2f')} steps  (<= {TARGETS['slot_steps']:.0f} step: "
              f"{verdict(steps_max, TARGETS['slot_steps'], False)}); "
              f"poll RTT {fmt(rtt and rtt * 1e3, '.1f')} ms"
              f"{'; NOT freed in ' + str(len(runs) - len(freed)) + ' runs' if len(freed) < len(runs) else ''}")
        traced = [r["trace"] for r in runs if r.get("trace")]
        if traced:
            keys = ["last_step_end_before_close", *TRACE_EVENTS, "next_step_end_after_close"]
            parts = []
            for k in keys:
                v = C.median(t.get(k) for t in traced)
                if v is not None:
                    parts.append(f"{k} {v * 1e3:+.0f}")
            print("      trace (median ms after close): " + ", ".join(parts))
            spans = [t["next_step_end_after_close"] - t["last_step_end_before_close"]
                     for t in traced if "next_step_end_after_close" in t
                     and "last_step_end_before_close" in t]
            if spans and ref:
                print(f"      engine step containing the close: median {C.median(spans) * 1e3:.0f} ms, "
                      f"max {max(spans) * 1e3:.0f} ms (x{C.median(spans) / ref:.2f} of a normal "
                      f"step: the poller's own CPU cost on a {os.cpu_count()}-CPU machine)")
            srv = [t["deliver:freed"] for t in traced if "deliver:freed" in t]
            if srv and ref:
                print(f"      server-side freed (SlotFreed delivered to trio): median "
                      f"{C.median(srv) * 1e3:.1f} ms, max {max(srv) * 1e3:.1f} ms -> "
                      f"{C.median(srv) / ref:.2f} / {max(srv) / ref:.2f} steps")
    return out_disc


def children_cpu() -> float:
    import resource
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


# -- main --------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", type=Path, help="checkpoint directory")
    src.add_argument("--fixture", choices=("bench", "tiny"), help="fixture checkpoint (built on demand)")
    ap.add_argument("--tokens", type=int, default=None, help="generated tokens per stream (128)")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="prompt length (128)")
    ap.add_argument("--blas", choices=("auto", "mkl", "openblas", "bundled", "inherit"),
                    default="auto",
                    help="auto: preload OpenBLAS when installed; inherit: leave LD_PRELOAD as is")
    ap.add_argument("--streams", default="4,8",
                    help="concurrency levels for the aggregate rows (4,8); the server runs -np max(8, ...)")
    ap.add_argument("--raw-eos", choices=("ban", "ignore"), default="ban",
                    help="raw side: ban EOS with mlx-lm's logit_bias, as the server's ignore_eos "
                         "does (default), or only keep going past it")
    ap.add_argument("--rounds", type=int, default=1,
                    help="raw/server rounds, order alternating; medians reported")
    ap.add_argument("--disconnect-reps", type=int, default=5)
    ap.add_argument("--disconnect-frames", type=int, default=4)
    ap.add_argument("--no-disconnect", action="store_true")
    ap.add_argument("--poll-ms", type=float, default=2.0,
                    help="GET /slots interval after the disconnect (2 ms)")
    ap.add_argument("--trace", action="store_true",
                    help="run the -np 1 server under bench/trace_server.py and break the "
                         "disconnect latency down by trace point")
    ap.add_argument("--quick", action="store_true", help="tiny-checkpoint smoke run (< 1 minute)")
    ap.add_argument("--json", type=Path, help="also write all measurements here")
    args = ap.parse_args(argv)
    if args.quick:
        args.fixture = args.fixture or ("tiny" if args.model is None else None)
        args.tokens = args.tokens or 64
        args.disconnect_reps = min(args.disconnect_reps, 3)
    args.tokens = args.tokens or 128
    args.streams = [int(x) for x in str(args.streams).split(",") if x.strip()]
    if args.model is None:
        from fixtures.build import ensure
        print(f"fixture {args.fixture or 'bench'}: ensuring (a first build can take minutes)...",
              flush=True)
        args.model = ensure(args.fixture or "bench")
    model = args.model.resolve()
    cfg = json.loads((model / "config.json").read_text())
    env = child_env(args.blas) if args.blas != "inherit" else dict(os.environ)

    ids = C.vocab_ids(model)
    spec = {
        "model": str(model), "tokens": args.tokens, "eos": args.raw_eos,
        "warmup_prompt": C.make_prompt(ids, args.prompt_tokens, 999),
        "single_prompt": C.make_prompt(ids, args.prompt_tokens, 0),
        "batch_prompts": {str(n): [C.make_prompt(ids, args.prompt_tokens, 100 * n + i)
                                   for i in range(n)] for n in args.streams},
    }
    t_all = time.perf_counter()
    LOADAVG.append(Path("/proc/loadavg").read_text().split()[:3])
    print(f"model {model}\nenv {C.blas_vars(env)}; {args.tokens} tokens/stream, "
          f"prompt {args.prompt_tokens} tokens", flush=True)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="mlxcel-bench-") as tmp:
        log_dir = Path(tmp)
        for i in range(args.rounds):
            order = ("raw", "server") if i % 2 == 0 else ("server", "raw")
            r = {}
            for side in order:
                t0 = time.perf_counter()
                print(f"round {i + 1}/{args.rounds}: {side} ...", end=" ", flush=True)
                m0, c0, p0 = C.machine_busy_s(), children_cpu(), time.process_time()
                r[side] = (run_raw(spec, env, log_dir) if side == "raw"
                           else run_server(model, env, spec, log_dir))
                ours = children_cpu() - c0 + time.process_time() - p0
                r[side]["foreign_cores"] = ((C.machine_busy_s() - m0 - ours)
                                            / (time.perf_counter() - t0))
                print(f"{time.perf_counter() - t0:.1f} s", flush=True)
            rounds.append(r)
        disc = None
        if not args.no_disconnect:
            t0 = time.perf_counter()
            print("disconnect test ...", end=" ", flush=True)
            disc = measure_disconnect(model, env, args,
                                      C.make_prompt(ids, min(16, args.prompt_tokens), 7), log_dir)
            print(f"{time.perf_counter() - t0:.1f} s", flush=True)
    result = report(args, model, env, rounds, disc, cfg)
    print(f"total {time.perf_counter() - t_all:.1f} s")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "env": C.blas_vars(env), "rounds": rounds,
                                         "disconnect": disc, **result}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

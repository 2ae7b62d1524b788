"""One model across two processes (mx.distributed, ring over loopback)
against one process: decode speed and the ratio.

    python bench/distributed.py                    # tiny fixture, about a minute
    python bench/distributed.py --fixture bench    # the Qwen3-0.6B-shaped fixture
    python bench/distributed.py --model DIR --split-mode layer

Starts `mlxcel-server` once alone and once under
`mlx.launch --backend ring -n 2` (same flags, -np 1, no prompt cache), sends
each the same greedy requests one after another, and prints the decode
rate each reports (timings.predicted_per_second, median over the runs), the
prompt rate, and the two-rank / one-process ratio.  On one machine both
ranks share its cores and every layer's all-reduce goes through loopback
TCP, so the ratio is the overhead of the split, not a speed-up; the point
of the split is a model that does not fit one machine.  Prints numbers;
asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = Path(sys.executable).parent / "mlx.launch"
READY = "main: model loaded"


def _free_port(pair: bool = False) -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if not pair:
            return p
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
    raise SystemExit("no free ports")


def _start(argv: list[str], timeout: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=ROOT)
    ready = threading.Event()

    def pump():
        for line in proc.stdout:
            if line.startswith(READY):
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(timeout):
        proc.terminate()
        raise SystemExit(f"not ready within {timeout} s: {' '.join(argv)}")
    return proc


def _stop(proc: subprocess.Popen, rank0_of: bool) -> None:
    if rank0_of:  # SIGTERM to rank 0 stops every rank (the launcher would not pass it on)
        kids = []
        for task in Path(f"/proc/{proc.pid}/task").iterdir():
            kids += (task / "children").read_text().split()
        for pid in kids:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if b"MLX_RANK=0" in env:
                os.kill(int(pid), 15)
    else:
        proc.terminate()
    proc.wait(60)


def _measure(url: str, prompt: str, n_predict: int, runs: int) -> tuple[float, float, str]:
    decode, prefill, text = [], [], ""
    with httpx.Client(timeout=600) as c:
        for i in range(runs + 1):  # the first run warms the compiled graphs
            r = c.post(url + "/completion", json={"prompt": prompt, "n_predict": n_predict,
                                                  "temperature": 0, "ignore_eos": True,
                                                  "cache_prompt": False})
            r.raise_for_status()
            body = r.json()
            if i:
                decode.append(body["timings"]["predicted_per_second"])
                prefill.append(body["timings"]["prompt_per_second"])
            text = body["content"]
    return statistics.median(decode), statistics.median(prefill), text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixture", default="tiny")
    ap.add_argument("--model")
    ap.add_argument("--split-mode", default=None)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    if args.model:
        model = args.model
    else:
        sys.path.insert(0, str(ROOT))
        from fixtures.build import ensure

        model = str(ensure(args.fixture))
    prompt = "The quick brown fox jumps over the lazy dog. " * 8
    flags = ["-m", model, "-np", "1", "-c", "2048", "--cache-ram", "0"]
    if args.split_mode:
        flags += ["--split-mode", args.split_mode]
    results = {}
    for label, launched in (("one process", False), ("two ranks (ring)", True)):
        port = _free_port()
        server = [sys.executable, "-m", "mlxcel_trio", *flags, "--port", str(port)]
        argv = ([str(LAUNCHER), "--backend", "ring", "-n", "2",
                 "--starting-port", str(_free_port(pair=True)), "--", *server]
                if launched else server)
        t0 = time.perf_counter()
        proc = _start(argv, args.timeout)
        ready_s = time.perf_counter() - t0
        try:
            results[label] = (*_measure(f"http://127.0.0.1:{port}", prompt, args.n_predict,
                                        args.runs), ready_s)
        finally:
            _stop(proc, launched)
    print(f"model: {model}  n_predict {args.n_predict}, median of {args.runs} runs, "
          f"{os.cpu_count()} CPUs")
    for label, (dec, pre, _, ready_s) in results.items():
        print(f"  {label:18s} decode {dec:8.2f} tok/s   prompt {pre:8.2f} tok/s   "
              f"ready in {ready_s:5.1f} s")
    (d1, p1, t1, _), (d2, p2, t2, _) = results.values()
    print(f"  two ranks / one process: decode {d2 / d1:.2f}x, prompt {p2 / p1:.2f}x; "
          f"same greedy text: {t1 == t2}")


if __name__ == "__main__":
    main()

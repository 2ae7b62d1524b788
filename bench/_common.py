"""Helpers shared by the benchmark driver and its raw mlx-lm worker.

Nothing here imports MLX: the driver process stays light, so that it costs
the measured processes as little CPU as possible on a 2-core machine.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"
# Environment variables that change what MLX's CPU backend does; both sides
# get exactly the same values, and the report prints them.
BLAS_ENV = ("LD_PRELOAD", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
            "OPENBLAS_CORETYPE", "GOTO_NUM_THREADS", "MLX_DISABLE_COMPILE",
            "MKL_CBWR", "MKL_NUM_THREADS", "MKL_THREADING_LAYER", "MLXCEL_BLAS")


# -- prompts -------------------------------------------------------------------

def vocab_ids(model_dir: Path) -> list[int]:
    """Ordinary (non-special) token ids of the checkpoint's tokenizer, sorted."""
    tok = json.loads((Path(model_dir) / "tokenizer.json").read_text())
    special = {t["id"] for t in tok.get("added_tokens", [])}
    vocab = tok["model"]["vocab"]
    ids = vocab.values() if isinstance(vocab, dict) else range(len(vocab))
    return sorted(i for i in ids if i not in special)


def eos_ids(model: Path) -> list[int]:
    out: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        p = model / name
        if p.exists():
            v = json.loads(p.read_text()).get("eos_token_id")
            out.update(v if isinstance(v, list) else [v] if v is not None else [])
    return sorted(out)


def banned_ids(model: Path) -> list[int]:
    """Ids a fixed-length benchmark request bans through `logit_bias`, the
    same for every server: the end-of-sequence ones, the tokenizer's added
    tokens (the tags a chat parser acts on) and every token that is not
    whole UTF-8 by itself (a random model strings byte pieces together,
    and llama-server ends such a stream with an error frame: its output
    parser rejects invalid UTF-8)."""
    from tokenizers import Tokenizer

    spec = json.loads((model / "tokenizer.json").read_text())
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    broken = [i for i in range(tok.get_vocab_size()) if "\ufffd" in tok.decode([i])]
    return sorted({*eos_ids(model), *(t["id"] for t in spec.get("added_tokens", [])), *broken})


def make_prompt(ids: list[int], length: int, seed: int) -> list[int]:
    """A deterministic prompt of `length` ordinary tokens (same seed, same ids)."""
    rng = random.Random(f"mlxcel-bench-{seed}")
    return [rng.choice(ids) for _ in range(length)]


# -- processes -----------------------------------------------------------------

def proc_status(pid: int | str = "self") -> dict[str, int]:
    """VmHWM / VmRSS / VmPeak in KiB from /proc/PID/status."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "VmRSS", "VmPeak", "Threads"):
            out[key] = int(rest.split()[0])
    return out


def blas_in_use(pid: int | str = "self") -> dict:
    """Which BLAS libraries are mapped into a process.  A preloaded MKL or
    OpenBLAS wins symbol resolution over mlx's bundled reference libblas,
    which stays mapped (mlx links it), so MKL / OpenBLAS mapped => in use."""
    libs = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6:
            name = os.path.basename(parts[5])
            if "openblas" in name or name.startswith("libblas") or "mkl" in name:
                libs.add(parts[5])
    # numpy wheels bundle their own (symbol-suffixed) scipy_openblas64_,
    # which mlx cannot resolve: it says nothing about mlx's BLAS.
    openblas = sorted(p for p in libs if "openblas" in os.path.basename(p)
                      and "scipy_openblas" not in os.path.basename(p))
    bundled = sorted(p for p in libs if os.path.basename(p).startswith("libblas"))
    if any("libmkl_rt" in os.path.basename(p) for p in libs):
        kind = "MKL"
    elif openblas:
        kind = "OpenBLAS"
    elif bundled:
        kind = "bundled reference BLAS"
    else:
        kind = "none mapped"
    return {"kind": kind, "libs": sorted(libs)}


def blas_vars(base: dict | None = None) -> dict[str, str]:
    """The BLAS-related variables of an environment, for the report."""
    env = base if base is not None else os.environ
    return {k: env[k] for k in BLAS_ENV if k in env}


# -- servers -------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def blas_env(mode: str, base: dict | None = None) -> dict[str, str]:
    """The environment every measured process gets for `--blas MODE`: auto
    (the library the server would preload by itself), mkl, openblas,
    bundled, or inherit.  The chosen library is preloaded and marked as the
    server's own choice, so the server does not re-execute itself and raw
    mlx-lm multiplies with the same library."""
    sys.path.insert(0, str(ROOT))
    from mlxcel_trio import blas

    env = dict(os.environ if base is None else base)
    if mode == "inherit":
        return env
    preload = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split()
               if "openblas" not in p and "mkl" not in p]
    lib = {"auto": blas.find(), "openblas": next((c for c in blas.candidates()[2:]
                                                  if c.is_file()), None),
           "mkl": next((c for c in blas.candidates()[:2] if c.is_file()), None),
           "bundled": None}[mode]
    if mode in ("openblas", "mkl") and lib is None:
        sys.exit(f"--blas {mode}: not found ({blas.install_hint()})")
    env.pop(blas.MARK, None)
    if lib is None:
        env[blas.ENV] = blas.BUNDLED
    else:
        plan = blas.reexec_plan(str(lib), {**env, "LD_PRELOAD": " ".join(preload)}, [])
        env = plan[1] if plan else env
    if not env.get("LD_PRELOAD"):
        env.pop("LD_PRELOAD", None)
    return env


def server_env(mode: str) -> dict[str, str]:
    env = blas_env(mode)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen | None) -> None:
    """SIGTERM, 20 s for the server's own shutdown, then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def start_server(model: Path, port: int, args: list[str], env: dict) -> subprocess.Popen:
    """An `mlxcel-server -np 1` (more with args) on 127.0.0.1:port, once /health answers."""
    import httpx

    proc = subprocess.Popen([sys.executable, "-m", "mlxcel_trio", "-m", str(model),
                             "--port", str(port), "-np", "1", *args],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit("server did not become ready")



def stream_completion(url: str, prompt, n_predict: int, client, barrier=None,
                      extra: dict | None = None) -> dict:
    """One streaming greedy `/completion` (EOS ignored) to mlxcel or
    llama-server: {t_send, events: [(seconds since send, tokens so far)],
    ids: {n: token id} where frames carry ids, final: the stop frame}.  A
    frame without `tokens_predicted` (llama-server's partials) counts one."""
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0,
            "ignore_eos": True, "stream": True, **(extra or {})}
    if barrier is not None:
        barrier.wait()
    # The client shares the machine's cores with the server it measures:
    # during the stream it only stamps the raw chunks as they arrive, and
    # splits and parses them afterwards.
    arrived: list[tuple[float, bytes]] = []
    t_send = time.perf_counter()
    with client.stream("POST", url + "/completion", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:500]!r}")
        for chunk in r.iter_raw():
            arrived.append((time.perf_counter(), chunk))
    events, ids, final = [], {}, None
    pending = b""
    for now, chunk in arrived:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if not line.startswith(b"data: "):
                continue
            obj = json.loads(line[6:])
            if obj.get("error"):
                raise RuntimeError(f"error frame: {obj['error']}")
            if obj.get("stop"):
                final = obj
            elif obj.get("tokens") or obj.get("content"):
                n = obj.get("tokens_predicted") or (events[-1][1] + 1 if events else 1)
                if events and events[-1][0] == now - t_send:
                    events[-1] = (now - t_send, n)  # frames that came in one read: one event
                else:
                    events.append((now - t_send, n))
                if obj.get("tokens"):
                    ids[n] = obj["tokens"][-1]
    return {"t_send": t_send, "events": events, "ids": ids, "final": final}


# -- metrics -------------------------------------------------------------------

def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def single_rate(events: list[tuple[float, int]]) -> float | None:
    """Decode tokens/s from (time, n_tokens_so_far) events of one stream,
    excluding prefill: (n_last - n_first) / (t_last - t_first)."""
    if len(events) < 2:
        return None
    (t0, n0), (t1, n1) = events[0], events[-1]
    return (n1 - n0) / (t1 - t0) if t1 > t0 else None


def step_gap(events: list[tuple[float, int]]) -> float | None:
    """Median time per token between consecutive events of one stream."""
    gaps = [(b[0] - a[0]) / (b[1] - a[1]) for a, b in pairwise(events) if b[1] > a[1]]
    return median(gaps)


def aggregate_rate(streams: list[list[tuple[float, int]]]) -> dict:
    """Aggregate decode tokens/s while every stream is decoding.

    The window runs from the moment the last stream got its first token
    (everyone has finished prefill) to the moment the first stream got its
    last token (everyone is still decoding); tokens are counted per stream
    from the n-so-far of each event.  Event times of one engine step differ a
    little across client threads, so both window edges are read with a
    tolerance of a third of the median step.  Also reports the end-to-end
    rate (all tokens / first send .. last token) for context.
    """
    streams = [s for s in streams if s]
    out: dict = {"streams": len(streams)}
    if not streams:
        return out
    gap = median(step_gap(s) for s in streams) or 0.0
    tol = gap / 3
    t0 = max(s[0][0] for s in streams)
    t1 = min(s[-1][0] for s in streams)

    def n_at(s, t):
        n = 0
        for ts, k in s:
            if ts <= t + tol:
                n = k
            else:
                break
        return n

    if t1 > t0:
        count = sum(n_at(s, t1) - n_at(s, t0) for s in streams)
        out["window_s"] = t1 - t0
        out["window_tokens"] = count
        out["rate"] = count / (t1 - t0)
    else:  # streams never all decoded at once
        first = min(s[0][0] for s in streams)
        last = max(s[-1][0] for s in streams)
        count = sum(s[-1][1] - s[0][1] for s in streams)
        out["rate"] = count / (last - first) if last > first else None
        out["window_s"], out["window_tokens"] = last - first, count
    out["step_s"] = gap
    return out


# -- CPU accounting ------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int | str = "self") -> dict[int, float]:
    """CPU seconds (user + system) of each live thread of a process."""
    out = {}
    base = Path(f"/proc/{pid}/task")
    for tid in os.listdir(base):
        try:
            stat = (base / tid / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / _TICK
    return out


def cpu_delta(before: dict[int, float], after: dict[int, float], main_tid: int) -> dict:
    """Process CPU seconds spent between two thread_cpu() snapshots, with the
    main thread's share and the busiest threads (threads that ended in
    between are missed; the engine's threads live as long as the process)."""
    per = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    busiest = sorted(per.values(), reverse=True)
    return {"total": sum(per.values()), "main": per.get(main_tid, 0.0),
            "top": [round(x, 2) for x in busiest[:4]], "threads": len(after)}


def quantile(xs, q: float):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def window_gaps(events: list[tuple[float, int]], width: int = 8) -> list[float]:
    """Time per token over windows of `width` tokens: frames that reach the
    client together (a read holding several, or a stream catching up) would
    otherwise count as near-zero steps."""
    gaps, j = [], 0
    for i, (t0, n0) in enumerate(events):
        j = max(j, i + 1)
        while j < len(events) and events[j][1] < n0 + width:
            j += 1
        if j == len(events):
            break
        t1, n1 = events[j]
        gaps.append((t1 - t0) / (n1 - n0))
    return gaps


def robust_rate(streams: list[list[tuple[float, int]]], q: float = 0.10) -> float | None:
    """Aggregate decode tok/s from the q-quantile of per-token intervals over
    all streams (n_streams / that interval).  Intermittent load from other
    processes stretches some steps a lot and leaves others alone; a low
    quantile of the step time is what the engine does when left alone."""
    gaps = []
    for s in streams:
        gaps += window_gaps(s)
    g = quantile(gaps, q)
    return len([s for s in streams if len(s) > 1]) / g if g else None


def machine_busy_s() -> float:
    """CPU seconds all processes on the machine have used since boot."""
    f = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f[:8])
    return (user + nice + system + irq + softirq + steal) / _TICK


def streams_at_once(url: str, prompts: list, n_predict: int, extra: dict | None = None) -> list:
    """One streaming completion per prompt, each on its own client and
    thread, released together by a barrier; their stream_completion results."""
    import threading

    import httpx

    barrier = threading.Barrier(len(prompts))
    results: list = [None] * len(prompts)

    def run(i: int) -> None:
        with httpx.Client(timeout=None) as client:
            results[i] = stream_completion(url, prompts[i], n_predict, client, barrier,
                                           extra)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results

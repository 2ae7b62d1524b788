"""Time to first token with a shared prompt prefix: cold vs prompt-cache hit,
and the prompt cache's memory against --cache-ram while prefixes churn.
A benchmark, not a test: it prints numbers and never fails on them.

    python bench/prompt_cache.py [--fixture bench|tiny|tiny-swa|tiny-hybrid | --model DIR]
                                 [--prefix 2000] [--suffix 16] [--hits 3]
                                 [--cache-ram 1024] [--churn 3] [--churn-tokens 300]
                                 [--blas auto|mkl|openblas|bundled|inherit] [--json OUT]
                                 [--disk] [--no-cache-cold] [--reuse N [--cut 64]]

One `mlxcel-server -np 1` runs the whole sequence, one request at a time:

  cold     prefix + suffix 0 on an empty cache: the whole prompt is prefilled
  hit i    prefix + suffix i (i = 1..hits): the prefix comes from the cache,
           only the suffix (and the adopted KV's copy into the batch) is paid
  churn    `--churn` distinct prompts of `--churn-tokens` tokens, then the hits'
           own donations, all under `--cache-ram` MiB: after every request
           GET /props' prompt_cache extension must show bytes <= budget
  disk     (--disk) the server ran with --cache-disk; a second server on the
           same directory answers prefix + a new suffix: the prefix comes from
           the disk tier (read, checksummed, loaded) after the restart
  nocache  (--no-cache-cold) prefix + suffix 0 on a server with --cache-ram 0:
           what the snapshots a sliding-window or hybrid model takes while it
           prefills (every SNAPSHOT_EVERY tokens, each message end) cost cold
  edit     (--reuse N) the edited-prompt workload on a server with
           --cache-reuse N: a prompt of --prefix tokens is sent, then again
           with --cut tokens cut out after its first tenth (an edit early in
           a long context), three ways on fresh prompts: cold (cache_prompt
           false), prefix only (n_cache_reuse 0: the part before the cut is
           reused) and shifted (the flag's default: the chunk behind the cut
           is shifted into place too, engine/kv_shift.py)

Time to first token is measured on the client: request sent -> first
streamed token frame.  `timings.cache_n` / `prompt_n` / `prompt_ms` from the
final frame are printed beside it.  Target: a hit's TTFT <= 10% of cold.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import _common as C  # noqa: E402


def ttft(url: str, prompt: list[int], **extra) -> dict:
    """Send a streaming /completion; time to the first token frame, and the
    final frame's prefill figures."""
    import httpx

    body = {"prompt": prompt, "n_predict": 2, "temperature": 0, "stream": True,
            "ignore_eos": True, **extra}
    t0 = time.perf_counter()
    first = None
    final = None
    with httpx.Client(timeout=3600) as c:
        with c.stream("POST", url + "/completion", json=body) as r:
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                frame = json.loads(line[6:])
                if first is None and frame.get("tokens"):
                    first = time.perf_counter() - t0
                if frame.get("stop"):
                    final = frame
    t = final["timings"]
    return {"ttft_s": first, "cache_n": t["cache_n"], "prompt_n": t["prompt_n"],
            "prompt_ms": t["prompt_ms"]}


def cache_state(url: str) -> dict:
    import httpx

    return httpx.get(url + "/props", timeout=30).json()["prompt_cache"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixture", default="bench",
                    choices=("bench", "tiny", "tiny-swa", "tiny-hybrid"))
    ap.add_argument("--model", type=Path)
    ap.add_argument("--prefix", type=int, default=2000)
    ap.add_argument("--suffix", type=int, default=16)
    ap.add_argument("--hits", type=int, default=3)
    ap.add_argument("--cache-ram", type=int, default=1024, help="MiB")
    ap.add_argument("--churn", type=int, default=3)
    ap.add_argument("--churn-tokens", type=int, default=300)
    ap.add_argument("--blas", default="auto", choices=("auto", "mkl", "openblas", "bundled", "inherit"))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--disk", action="store_true", help="also time a disk-tier hit after a restart")
    ap.add_argument("--no-cache-cold", action="store_true",
                    help="also time cold on a server without a prompt cache (snapshot cost)")
    ap.add_argument("--reuse", type=int, metavar="N",
                    help="also the edited-prompt workload on a server with --cache-reuse N")
    ap.add_argument("--cut", type=int, default=64, help="tokens the edit cuts out (--reuse)")
    a = ap.parse_args(argv)

    if a.model is None:
        from fixtures.build import ensure

        a.model = ensure(a.fixture)
    ids = C.vocab_ids(a.model)
    prefix = C.make_prompt(ids, a.prefix, 0)
    suffixes = [C.make_prompt(ids, a.suffix, 100 + i) for i in range(a.hits + 1)]
    churn = [C.make_prompt(ids, a.churn_tokens, 200 + i) for i in range(a.churn)]

    env = C.server_env(a.blas)
    port = C.free_port()
    url = f"http://127.0.0.1:{port}"
    ctx = 2 * (a.prefix + a.suffix) + 64
    import tempfile

    disk = Path(tempfile.mkdtemp(prefix="mlxcel-bench-disk-")) if a.disk else None
    disk_args = ["--cache-disk", str(disk)] if disk else []
    proc = C.start_server(a.model, port, ["-c", str(ctx), "--cache-ram", str(a.cache_ram),
                                          *disk_args], env)
    out: dict = {"model": str(a.model), "blas": C.blas_in_use(proc.pid)["kind"],
                 "blas_env": C.blas_vars(env), "prefix": a.prefix, "suffix": a.suffix,
                 "cache_ram_mib": a.cache_ram, "runs": [], "cache": []}
    budget = a.cache_ram * 1024 * 1024
    try:
        def record(label: str, prompt: list[int]) -> dict:
            r = {"run": label, **ttft(url, prompt)}
            st = cache_state(url)
            r["cache_bytes"] = st["bytes"]
            out["runs"].append(r)
            out["cache"].append(st)
            print(f"{label:>8}: ttft {r['ttft_s']:.3f} s  cache_n {r['cache_n']:>5}  "
                  f"prompt_n {r['prompt_n']:>5}  prompt_ms {r['prompt_ms']:.0f}  "
                  f"cache {st['bytes'] / 2**20:.0f} MiB in {st['entries']} entries",
                  flush=True)
            return r

        cold = record("cold", prefix + suffixes[0])
        hits = [record(f"hit {i}", prefix + suffixes[i]) for i in range(1, a.hits + 1)]
        for i, p in enumerate(churn):
            record(f"churn {i}", p)
        med_hit = C.median(h["ttft_s"] for h in hits)
        peak = max(s["peak_bytes"] for s in out["cache"])
        worst = max(s["bytes"] for s in out["cache"])
        out.update(cold_ttft_s=cold["ttft_s"], hit_ttft_s=med_hit,
                   hit_over_cold=med_hit / cold["ttft_s"], peak_cache_bytes=peak,
                   max_cache_bytes=worst, budget_bytes=budget)
        print(f"\nmodel {a.model.name}, BLAS {out['blas']}, prefix {a.prefix} + suffix "
              f"{a.suffix} tokens")
        print(f"TTFT cold {cold['ttft_s']:.3f} s, hit (median of {len(hits)}) {med_hit:.3f} s "
              f"-> hit/cold {med_hit / cold['ttft_s']:.1%} (target <= 10%)")
        print(f"prompt cache: peak {peak / 2**20:.0f} MiB, max held {worst / 2**20:.0f} MiB, "
              f"budget {a.cache_ram} MiB -> {'within' if peak <= budget else 'OVER'} budget")
    finally:
        _stop(proc)
    for label, wanted, args in (("disk", a.disk, ["--cache-ram", str(a.cache_ram), *disk_args]),
                                ("nocache", a.no_cache_cold, ["--cache-ram", "0"])):
        if not wanted:
            continue
        proc = C.start_server(a.model, port, ["-c", str(ctx), *args], env)
        try:
            fresh = C.make_prompt(ids, a.suffix, 999)   # no donation ended with it
            r = {"run": label, **ttft(url, prefix + (fresh if label == "disk"
                                                     else suffixes[0]))}
        finally:
            _stop(proc)
        out["runs"].append(r)
        out[f"{label}_ttft_s"] = r["ttft_s"]
        print(f"{label:>8}: ttft {r['ttft_s']:.3f} s  cache_n {r['cache_n']:>5}  "
              f"prompt_n {r['prompt_n']:>5} -> {r['ttft_s'] / out['cold_ttft_s']:.1%} of cold",
              flush=True)
    if a.reuse:
        out["edit"] = _edit_workload(a, ids, url, port, ctx, env)
    if disk is not None:
        import shutil

        shutil.rmtree(disk, ignore_errors=True)
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


def _edit_workload(a, ids, url: str, port: int, ctx: int, env: dict) -> dict:
    """--reuse: an edited prompt's TTFT cold, with the prefix only and with
    the chunk behind the cut shifted; each arm on a prompt of its own."""
    keep = a.prefix // 10
    arms = (("cold", {"cache_prompt": False}), ("prefix", {"n_cache_reuse": 0}), ("shifted", {}))
    proc = C.start_server(a.model, port, ["-c", str(ctx), "--cache-ram", str(a.cache_ram),
                                          "--cache-reuse", str(a.reuse)], env)
    runs = {}
    try:
        for k, (label, extra) in enumerate(arms):
            whole = C.make_prompt(ids, a.prefix + a.suffix, 300 + k)
            ttft(url, whole)
            r = runs[label] = ttft(url, whole[:keep] + whole[keep + a.cut:], **extra)
            print(f"{'edit ' + label:>14}: ttft {r['ttft_s']:.3f} s  cache_n {r['cache_n']:>5}  "
                  f"prompt_n {r['prompt_n']:>5} -> {r['ttft_s'] / runs['cold']['ttft_s']:.1%} "
                  "of cold", flush=True)
    finally:
        _stop(proc)
    print(f"edited prompt ({a.prefix + a.suffix - a.cut} tokens, {a.cut} cut after {keep}), "
          f"--cache-reuse {a.reuse}: shifted/prefix-only TTFT "
          f"{runs['shifted']['ttft_s'] / runs['prefix']['ttft_s']:.1%}")
    return runs


def _stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


if __name__ == "__main__":
    raise SystemExit(main())

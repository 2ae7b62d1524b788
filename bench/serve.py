"""A serving benchmark in the manner of `vllm bench serve` / GuideLLM: one
client harness against mlxcel-server, mlx_lm.server and (given a binary)
llama-server, on the same weights.  A benchmark, not a test: it prints a
table, never fails on figures.

    python bench/serve.py --model DIR                      # mlxcel + mlx_lm.server
    python bench/serve.py --model DIR --llama-server BIN --gguf FILE
    python bench/serve.py --fixture tiny --runs 1 --rates 2 --concurrency 1,2 \\
        --requests 4 --output-tokens 8                      # a smoke run

Workloads, each run `--runs` times (default 3) after a warm-up request:

- `rate=R`: `--requests` requests with Poisson arrivals at R requests/s
  (exponential gaps, fixed seed), every request its own random prompt;
- `conc=C`: `--requests` requests kept C at a time (closed loop);
- `multiturn`: `--conversations` conversations of `--turns` turns run side by
  side; each turn's prompt is the previous prompt, its answer and a new
  user chunk, so the prefix repeats (what a prompt cache is for).

Every request streams /v1/completions (the route all three servers serve)
with a fixed output length: `ignore_eos` for mlxcel and llama-server, and
for every server the same `logit_bias` banning the end-of-sequence ids, the
tokenizer's added tokens (`<think>`, `<tool_call>`, ...) and the tokens that
are not whole UTF-8 by themselves (mlx_lm.server has no ignore_eos;
llama-server's output parser ends a stream with an error frame when a
random model strings byte pieces into invalid UTF-8).  An error frame in the
stream counts the request as failed.  Per request: TTFT (send to first text frame), TPOT
((end - first) / (tokens - 1)), ITL (gaps between frames; a frame holding
several tokens counts once) and end-to-end latency; per run: output tokens/s
over the run's wall time, requests/s and goodput (requests/s meeting both
`--slo-ttft-ms` and `--slo-tpot-ms`).  The table gives p50 / p90 / p99 over
every run's requests and the mean of the per-run throughputs.

The client runs on the machine it measures (asyncio + httpx, one event
loop): on a busy host its own work shows in the figures; say so with them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import _common as C  # noqa: E402
import _serve_plots  # noqa: E402
from forms import Proc, Prompts, startup_lines  # noqa: E402

SYSTEMS = ("mlxcel", "mlx_lm.server", "llama-server")
TIMEOUT = httpx.Timeout(1800, connect=30)


# -- one request ---------------------------------------------------------------

async def request(client: httpx.AsyncClient, url: str, system: str, prompt: str, n: int,
                  banned: list[int]) -> dict:
    body: dict = {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True,
                  "stream_options": {"include_usage": True},
                  "logit_bias": {str(t): -100 for t in banned}}
    if system != "mlx_lm.server":
        body["ignore_eos"] = True
    frames: list[float] = []
    text, usage, error = [], None, None
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                obj = json.loads(line[6:])
                if obj.get("error"):
                    raise RuntimeError(f"error frame: {obj['error']}")
                usage = obj.get("usage") or usage
                for ch in obj.get("choices") or []:
                    if ch.get("text"):
                        frames.append(time.perf_counter() - t0)
                        text.append(ch["text"])
    except Exception as exc:   # a failed request is counted, not fatal
        error = f"{exc!r}"[:300]
    end = time.perf_counter() - t0
    tokens = (usage or {}).get("completion_tokens") or len(frames)
    return {"t_send": t0, "e2e": end, "ttft": frames[0] if frames else None,
            "tpot": (end - frames[0]) / (tokens - 1) if frames and tokens > 1 else None,
            "itl": [b - a for a, b in zip(frames, frames[1:])], "tokens": tokens,
            "text": "".join(text), "error": error}


# -- workloads -----------------------------------------------------------------

async def poisson(send, prompts: list[str], rate: float, seed: int) -> list[dict]:
    rng = random.Random(seed)
    tasks = []
    for p in prompts:
        tasks.append(asyncio.create_task(send(p)))
        await asyncio.sleep(rng.expovariate(rate))
    return list(await asyncio.gather(*tasks))


async def closed_loop(send, prompts: list[str], concurrency: int) -> list[dict]:
    queue = list(prompts)
    out: list[dict] = []

    async def worker():
        while queue:
            out.append(await send(queue.pop(0)))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


async def multiturn(send, starts: list[str], chunks: list[list[str]]) -> list[dict]:
    async def conversation(first: str, more: list[str]) -> list[dict]:
        prompt, done = first, []
        for turn in [None, *more]:
            if turn is not None:
                prompt = prompt + done[-1]["text"] + turn
            done.append(await send(prompt))
        return done

    per = await asyncio.gather(*(conversation(s, c) for s, c in zip(starts, chunks)))
    return [r for conv in per for r in conv]


# -- analysis ------------------------------------------------------------------

def pct(xs: list[float], q: float) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    return C.quantile(xs, q) if xs else None


def summarize(runs: list[tuple[float, list[dict]]], slo_ttft: float, slo_tpot: float) -> dict:
    reqs = [r for _, rs in runs for r in rs if r["error"] is None]
    s: dict = {"requests": sum(len(rs) for _, rs in runs), "errors": sum(
        r["error"] is not None for _, rs in runs for r in rs)}
    for name, xs in (("ttft", [r["ttft"] for r in reqs]), ("tpot", [r["tpot"] for r in reqs]),
                     ("itl", [g for r in reqs for g in r["itl"]]), ("e2e", [r["e2e"] for r in reqs])):
        s[name] = {q: pct(xs, q / 100) for q in (50, 90, 99)}
    tok, rps, good = [], [], []
    for wall, rs in runs:
        ok = [r for r in rs if r["error"] is None]
        tok.append(sum(r["tokens"] for r in ok) / wall)
        rps.append(len(ok) / wall)
        good.append(sum(r["ttft"] is not None and r["ttft"] <= slo_ttft
                        and (r["tpot"] or 0) <= slo_tpot for r in ok) / wall)
    s["tok_s"], s["req_s"], s["goodput"] = (sum(v) / len(v) for v in (tok, rps, good))
    s["error_kinds"] = sorted({r["error"][:120] for _, rs in runs for r in rs if r["error"]})[:3]
    return s


def ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.0f}"


def table(results: dict[str, dict[str, dict]]) -> str:
    head = ("| system | workload | req (err) | TTFT p50/p90/p99 ms | TPOT p50/p90/p99 ms | "
            "ITL p50/p90/p99 ms | E2E p50/p90/p99 ms | out tok/s | req/s | goodput req/s |")
    lines = [head, "|" + "---|" * 10]
    for system, per in results.items():
        for wl, s in per.items():
            if "error" in s:
                lines.append(f"| {system} | {wl} | {s['error'][:80]} |" + " |" * 7)
                continue
            trio = lambda m: "/".join(ms(s[m][q]) for q in (50, 90, 99))  # noqa: E731
            lines.append(f"| {system} | {wl} | {s['requests']} ({s['errors']}) | {trio('ttft')} | "
                         f"{trio('tpot')} | {trio('itl')} | {trio('e2e')} | {s['tok_s']:.1f} | "
                         f"{s['req_s']:.2f} | {s['goodput']:.2f} |")
    return "\n".join(lines)


# -- one server ----------------------------------------------------------------

def argv_for(system: str, args, port: int) -> list[str]:
    if system == "mlxcel":
        return [sys.executable, "-m", "mlxcel_trio", "-m", str(args.model), "-np",
                str(args.slots), "--host", "127.0.0.1", "--port", str(port), *args.mlxcel_arg]
    if system == "llama-server":
        ctx = args.slots * (args.prompt_tokens * (args.turns + 1) + args.output_tokens
                            * args.turns + 256)
        return [args.llama_server, "-m", str(args.gguf), "-np", str(args.slots), "-c", str(ctx),
                "--host", "127.0.0.1", "--port", str(port)]
    return [sys.executable, "-m", "mlx_lm", "server", "--model", str(args.model),
            "--host", "127.0.0.1", "--port", str(port)]


async def bench_server(url: str, system: str, args, prompts, banned: list[int]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    # a fresh connection per request: llama-server closes idle kept-alive
    # connections, and a request sent on one as it closes fails
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=TIMEOUT, limits=limits) as client:
        async def send(p: str, n: int = args.output_tokens) -> dict:
            return await request(client, url, system, p, n, banned)

        warm = await send(prompts.text(prompts.warmup), 2)   # mlx_lm.server loads here
        if warm["error"]:
            return {"warm-up": {"error": warm["error"]}}
        workloads: list[tuple[str, object]] = (
            [(f"rate={r:g}", lambda i, r=r: poisson(send, fresh(i), r, seed=i)) for r in args.rates]
            + [(f"conc={c}", lambda i, c=c: closed_loop(send, fresh(i), c)) for c in args.concurrency]
            + ([("multiturn", lambda i: multiturn(send, *conversations(i)))]
               if args.turns > 0 and args.conversations > 0 else []))

        def fresh(i: int) -> list[str]:
            return [prompts.text(C.make_prompt(prompts.pool, args.prompt_tokens, 1000 * i + j))
                    for j in range(args.requests)]

        def conversations(i: int) -> tuple[list[str], list[list[str]]]:
            mk = lambda n, seed: prompts.text(C.make_prompt(prompts.pool, n, seed))  # noqa: E731
            starts = [mk(args.prompt_tokens, 50_000 + 100 * i + c) for c in range(args.conversations)]
            chunks = [[mk(args.turn_tokens, 90_000 + 1000 * i + 10 * c + t)
                       for t in range(args.turns - 1)] for c in range(args.conversations)]
            return starts, chunks

        for name, make in workloads:
            runs = []
            for i in range(args.runs):
                t0 = time.perf_counter()
                rs = await make(i)
                runs.append((time.perf_counter() - t0, rs))
            out[name] = summarize(runs, args.slo_ttft_ms / 1e3, args.slo_tpot_ms / 1e3)
            print(f"  {system} {name}: {out[name]['tok_s']:.1f} out tok/s, TTFT p50 "
                  f"{ms(out[name]['ttft'][50])} ms, errors {out[name]['errors']}"
                  + "".join(f"\n    {e}" for e in out[name]["error_kinds"]), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="MLX checkpoint directory")
    ap.add_argument("--fixture", help="a fixture kind instead of --model (e.g. tiny, bench-4bit)")
    ap.add_argument("--systems", default="mlxcel,mlx_lm.server",
                    help="comma list of " + ", ".join(SYSTEMS))
    ap.add_argument("--llama-server", help="llama-server binary (adds it to --systems)")
    ap.add_argument("--gguf", type=Path, help="the GGUF of the same weights, for llama-server")
    ap.add_argument("--rates", default="0.5,1,2", help="Poisson request rates, req/s (0.5,1,2)")
    ap.add_argument("--concurrency", default="1,4", help="closed-loop concurrencies (1,4)")
    ap.add_argument("--requests", type=int, default=8, help="requests per rate / concurrency run")
    ap.add_argument("--conversations", type=int, default=2)
    ap.add_argument("--turns", type=int, default=3, help="turns per conversation; 0 skips it")
    ap.add_argument("--turn-tokens", type=int, default=16, help="new user tokens per later turn")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=32, help="fixed output length")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--slots", type=int, default=4, help="-np for mlxcel and llama-server")
    ap.add_argument("--slo-ttft-ms", type=float, default=2000)
    ap.add_argument("--slo-tpot-ms", type=float, default=500)
    ap.add_argument("--mlxcel-arg", action="append", default=[],
                    help="extra mlxcel-server argument (repeatable)")
    ap.add_argument("--start-timeout", type=float, default=600)
    ap.add_argument("--json", type=Path, help="write the summaries here")
    ap.add_argument("--plots", type=Path, help="write one PNG per metric into this folder")
    ap.add_argument("--replot", type=Path, metavar="JSON",
                    help="no run: print the table (and --plots) of a --json file")
    args = ap.parse_args()
    if args.replot:
        results = json.loads(args.replot.read_text())
        print(table(results))
        return plots(results, args.plots, args.replot.stem)
    if args.fixture:
        from fixtures.build import ensure

        args.model = ensure(args.fixture)
    if args.model is None:
        ap.error("give --model or --fixture")
    args.rates = [float(r) for r in args.rates.split(",") if r]
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    systems = [s for s in args.systems.split(",") if s]
    if args.llama_server and "llama-server" not in systems:
        systems.append("llama-server")
    if "llama-server" in systems and not (args.llama_server and args.gguf):
        ap.error("llama-server needs --llama-server BIN and --gguf FILE")
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        ap.error(f"unknown systems {sorted(unknown)}; expected some of {', '.join(SYSTEMS)}")

    args.stream_prompt_tokens, args.streams = args.prompt_tokens, []
    prompts = Prompts(args.model, args)
    banned = C.banned_ids(args.model)
    env = C.server_env("auto")
    log_dir = Path(tempfile.mkdtemp(prefix="mlxcel-serve-"))
    print(f"{args.model}: {', '.join(systems)}; {args.runs} run(s); output {args.output_tokens} "
          f"tokens; load average {os.getloadavg()[0]:.1f}; logs in {log_dir}", flush=True)
    results: dict[str, dict] = {}
    for system in systems:
        port = C.free_port()
        srv = Proc(argv_for(system, args, port), env, port, log_dir / f"{system}.log")
        try:
            srv.start(args.start_timeout)
            results[system] = asyncio.run(bench_server(srv.url, system, args, prompts, banned))
        except Exception as exc:
            results[system] = {"start": {"error": f"{exc!r}"[:500]}}
        finally:
            srv.stop()
        for line in startup_lines(srv.log.read_text(errors="replace")):
            print(f"    {line}")
    print()
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return plots(results, args.plots, f"{args.model.name}, load {os.getloadavg()[0]:.1f}")


def plots(results: dict[str, dict[str, dict]], out: Path | None, note: str) -> int:
    if out is None:
        return 0
    why = _serve_plots.available()
    if why:
        print(why, file=sys.stderr)
        return 0
    for path in _serve_plots.write(results, out, note):
        print(f"plot: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

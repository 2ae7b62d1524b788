"""Speculative decoding: mlxcel-server with and without drafting, and mlx-lm's
own single-stream speculative generation as the peer (not a test).

    python bench/speculative.py --quick                 # tiny fixture, ~1 min
    python bench/speculative.py --fixture bench --tokens 32
    python bench/speculative.py --fixture bench-successor   # a checkpoint that copies

One run, one checkpoint, one environment.  The prompt is copy-heavy: a seed
passage S, the model's own greedy continuation G of S (from a plain server),
then S again, so a continuation that repeats G is the prompt's own text.
Each configuration is one `mlxcel-server` process, started, measured and
stopped before the next:

| row | what | target |
|---|---|---|
| ngram-simple / plain, 1 and 4 streams | decode tok/s with --spec-type ngram-simple over the same server without it | >= 1.5x single stream |
| draft = target / plain | -md <the target itself>: the mechanism's ceiling (every draft accepted) and its overhead | info |
| draft = target vs mlx-lm | the server's single stream against mlx-lm's `stream_generate(draft_model=...)` with the same draft and draft length | >= 0.95x |

Decode rates exclude prefill ((n_last - n_first) / (t_last - t_first) of one
stream, or the window in which every stream decodes).  Acceptance is
timings.draft_n_accepted / draft_n summed over the streams.  Greedy
agreement with the plain server is printed for every row (speculation must
not change a token).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as C


def run_streams(url: str, prompts: list[list[int]], n: int) -> dict:
    results = C.streams_at_once(url, prompts, n)
    streams = [r["events"] for r in results]
    rate = (C.single_rate(streams[0]) if len(streams) == 1
            else C.aggregate_rate(streams).get("rate"))
    finals = [r["final"] or {} for r in results]
    drafted = sum(f.get("timings", {}).get("draft_n", 0) for f in finals)
    kept = sum(f.get("timings", {}).get("draft_n_accepted", 0) for f in finals)
    ids = [[r["ids"][k] for k in sorted(r["ids"])] for r in results]
    return {"rate": rate, "drafted": drafted, "accepted": kept, "ids": ids}


def serve(model: Path, args: list[str], env: dict, work) -> dict:
    port = C.free_port()
    proc = C.start_server(model, port, ["-np", "4", "-c", "4096", *args], env)
    try:
        return work(f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        proc.wait(60)


def mlx_lm_peer(model_dir: Path, prompt: list[int], n: int, k: int, env: dict) -> dict:
    """The peer in its own process, with the servers' environment (BLAS)."""
    import json
    import subprocess

    done = subprocess.run([sys.executable, __file__, "--peer", str(model_dir), json.dumps(prompt),
                           str(n), str(k)], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def peer_main(model_dir: str, prompt_json: str, n: str, k: str) -> int:
    import json

    print(json.dumps(_peer(Path(model_dir), json.loads(prompt_json), int(n), int(k))))
    return 0


def _peer(model_dir: Path, prompt: list[int], n: int, k: int) -> dict:
    """mlx-lm's single-stream decode, plain and with the target as its own
    draft (`stream_generate(draft_model=...)`), rates from per-token times."""
    import mlx.core as mx
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_logits_processors
    from mlx_lm.utils import load

    model, tok = load(str(model_dir))
    eos = sorted(tok.eos_token_ids)
    ban = make_logits_processors(logit_bias={e: -1e9 for e in eos})
    out = {}
    for name, kw in (("plain", {}), ("spec", {"draft_model": model, "num_draft_tokens": k})):
        times, ids, accepted = [], [], 0
        t0 = time.perf_counter()
        for r in stream_generate(model, tok, mx.array(prompt), max_tokens=n,
                                 logits_processors=ban, **kw):
            times.append((time.perf_counter() - t0, len(times) + 1))
            ids.append(r.token)
            accepted += bool(getattr(r, "from_draft", False))
        out[name] = {"rate": C.single_rate(times), "ids": ids, "accepted": accepted}
    return out


def ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixture", default="bench")
    ap.add_argument("--model", type=Path)
    ap.add_argument("--quick", action="store_true", help="tiny fixture, short run")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--seed-tokens", type=int, default=48)
    ap.add_argument("--n-max", type=int, default=4, help="draft length for the draft model")
    ap.add_argument("--blas", default="auto")
    args = ap.parse_args(argv)
    if args.quick:
        args.fixture, args.tokens = "tiny", 48
    if args.model is None:
        from fixtures.build import ensure
        args.model = ensure(args.fixture)
    env = C.server_env(args.blas)
    ids = C.vocab_ids(args.model)
    seeds = [C.make_prompt(ids, args.seed_tokens, s) for s in range(4)]
    n = args.tokens

    # the copy-heavy prompts: S + G + S, G the model's own continuation of S
    plain_g = serve(args.model, [], env, lambda url: run_streams(url, seeds, args.seed_tokens))
    prompts = [s + g + s for s, g in zip(seeds, plain_g["ids"])]
    ngram = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4",
             "--spec-ngram-simple-size-m", "16"]
    draft = ["-md", str(args.model), "--spec-draft-n-max", str(args.n_max)]
    rows: dict[str, dict] = {}
    for name, extra in (("plain", []), ("ngram-simple", ngram), ("draft=target", draft)):
        def work(url):
            return {1: run_streams(url, prompts[:1], n), 4: run_streams(url, prompts, n)}
        rows[name] = serve(args.model, extra, env, work)
    peer = mlx_lm_peer(args.model, prompts[0], n, args.n_max, env)

    print(f"model {args.model} | {n} tokens per stream | prompt {len(prompts[0])} tokens "
          f"(S + G + S) | load {Path('/proc/loadavg').read_text().split()[:3]}")
    base = rows["plain"]
    print(f"{'row':<16}{'streams':>8}{'tok/s':>10}{'vs plain':>10}{'accepted':>16}{'same ids':>10}")
    for name, r in rows.items():
        for width in (1, 4):
            x = r[width]
            acc = (f"{x['accepted']}/{x['drafted']} ({x['accepted'] / x['drafted']:.0%})"
                   if x["drafted"] else "-")
            same = x["ids"] == base[width]["ids"]
            print(f"{name:<16}{width:>8}{(x['rate'] or 0):>10.2f}"
                  f"{ratio(x['rate'], base[width]['rate']):>10}{acc:>16}{same!s:>10}")
    for name in ("plain", "spec"):
        p = peer[name]
        print(f"{'mlx-lm ' + name:<16}{1:>8}{(p['rate'] or 0):>10.2f}"
              f"{ratio(p['rate'], peer['plain']['rate']):>10}"
              f"{(str(p['accepted']) + ' from draft') if name == 'spec' else '-':>16}"
              f"{p['ids'] == base[1]['ids'][0]!s:>10}")
    print(f"ngram-simple single stream vs plain: {ratio(rows['ngram-simple'][1]['rate'], base[1]['rate'])}"
          " (target >= 1.5x)")
    print(f"draft=target single stream vs mlx-lm speculative: "
          f"{ratio(rows['draft=target'][1]['rate'], peer['spec']['rate'])} (target >= 0.95x)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--peer":
        sys.exit(peer_main(*sys.argv[2:]))
    sys.exit(main())

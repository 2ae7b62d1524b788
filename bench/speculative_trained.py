"""Speculative decoding on the trained fixture: real copying, a real draft.

    python bench/speculative_trained.py            # ~4 min on 2 cores
    python bench/speculative_trained.py --prompts 2 --tokens 96
    python bench/speculative_trained.py --draft DIR --draft DIR2 --draft-max 2 --draft-max 4

The prompts are held-out copy-heavy chats (fixtures.trained_corpus: repeat
and edit a paragraph, a list or a code block), rendered with the
checkpoint's Qwen3 template, thinking off, so the answer is mostly the
prompt's own text.  One server process per row, single stream, greedy, EOS
honoured (the answer ends where the model ends it).  All the servers run
side by side and the requests alternate between them (--rounds passes over
the prompts), so the rows share the machine's load:

| row | what | target |
|---|---|---|
| ngram-simple (m 16 and 4), ngram-map-k, -k4v, -mod, -cache / plain | decode tok/s over the same server without speculation | >= 1.5x (best n-gram type) |
| draft (fixtures/trained/draft) / plain | -md with the trained draft (1 layer, 0.12M) | >= 1.3x |
| plain / mlx-lm | the server's plain decode against mlx-lm's stream_generate | info |

Every row must give the plain row's token ids (speculation is lossless);
acceptance is read from each server's /metrics.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as C

ROWS = {
    "plain": [],
    "ngram-simple": ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
                     "--spec-ngram-simple-size-m", "16"],
    "ngram-simple-4": ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
                       "--spec-ngram-simple-size-m", "4"],
    "ngram-map-k": ["--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-n", "3"],
    "ngram-map-k4v": ["--spec-type", "ngram-map-k4v"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
    "ngram-cache": ["--spec-type", "ngram-cache"],
}
COUNTERS = ("llamacpp:spec_decode_num_draft_tokens_total",
            "llamacpp:spec_decode_num_accepted_tokens_total")


def copy_prompts(model: Path, n: int) -> list[list[int]]:
    from tokenizers import Tokenizer

    from fixtures import trained_corpus as corpus

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    template = corpus.template_env()
    chats = [c for c in corpus.held_out(seed=880_001, n=200) if c.kind in ("repeat", "edit")]
    out = []
    for chat in chats:
        user = [m for m in chat.messages if m["role"] == "user"][:1]
        text = template.render(messages=user, add_generation_prompt=True, enable_thinking=False)
        out.append(tok.encode(text).ids)
    return sorted(out, key=len, reverse=True)[:n]  # the longest: the most to copy


def metrics(url: str) -> dict[str, float]:
    import httpx

    text = httpx.get(url + "/metrics", timeout=10).text
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in COUNTERS:
            found[name] = float(value)
    return found


def run_rows(model: Path, rows: dict[str, list[str]], prompts, n: int, rounds: int,
             env: dict, weights: str) -> dict[str, dict]:
    """Every row's server up at once, then the requests interleaved: round by
    round, prompt by prompt, one request per row in turn, so a change in the
    machine's load falls on every row alike.  Beside the wall-clock rate,
    each server's CPU seconds (all its threads) over the requests: under a
    load that stretches single requests several-fold, CPU time per token
    still compares the rows' work."""
    procs, urls = {}, {}
    try:
        for name, args in rows.items():
            port = C.free_port()
            procs[name] = C.start_server(model, port, ["-c", "4096", "--metrics", "--weights",
                                                       weights, *args], env)
            urls[name] = f"http://127.0.0.1:{port}"
        for url in urls.values():
            C.streams_at_once(url, prompts[:1], 8, {"ignore_eos": False})  # warm-up
        rates = {name: [] for name in rows}
        cpu, made = dict.fromkeys(rows, 0.0), dict.fromkeys(rows, 0)
        ids = {name: [None] * len(prompts) for name in rows}
        for _ in range(rounds):
            for k, p in enumerate(prompts):
                for name, url in urls.items():
                    before = sum(C.thread_cpu(procs[name].pid).values())
                    r = C.streams_at_once(url, [p], n, {"ignore_eos": False})[0]
                    cpu[name] += sum(C.thread_cpu(procs[name].pid).values()) - before
                    made[name] += len(r["ids"])
                    rates[name].append(C.single_rate(r["events"]))
                    got = [r["ids"][i] for i in sorted(r["ids"])]
                    ids[name][k] = got if ids[name][k] in (None, got) else "differs between rounds"
        found = {name: metrics(url) for name, url in urls.items()}
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(60)
    out = {}
    for name in rows:
        drafted, accepted = (found[name].get(c, 0.0) for c in COUNTERS)
        got = [r for r in rates[name] if r is not None]
        out[name] = {"rate": C.median(got), "spread": (min(got), max(got)), "ids": ids[name],
                     "drafted": drafted, "accepted": accepted,
                     "cpu_ms": 1e3 * cpu[name] / max(made[name], 1)}
    return out


def mlx_lm_rate(model: Path, prompt: list[int], n: int) -> float | None:
    import mlx.core as mx
    from mlx_lm.generate import stream_generate
    from mlx_lm.utils import load

    m, tok = load(str(model))
    times = []
    t0 = time.perf_counter()
    for _ in stream_generate(m, tok, mx.array(prompt), max_tokens=n):
        times.append((time.perf_counter() - t0, len(times) + 1))
    return C.single_rate(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--draft", type=Path, action="append",
                    help="a draft checkpoint, repeatable (default: trained-draft)")
    ap.add_argument("--draft-max", type=int, action="append",
                    help="tokens drafted per round, repeatable (default: 4)")
    ap.add_argument("--model", type=Path, help="the target checkpoint (default: trained)")
    ap.add_argument("--rows", help="comma-separated row names to run (default: all; plain always)")
    ap.add_argument("--blas", default="auto")
    ap.add_argument("--weights", default="keep",
                    help="every server's --weights (keep: all on the native kernels where they "
                         "load; auto times both per process, and at this size the two are close, "
                         "so servers started side by side can differ)")
    args = ap.parse_args(argv)
    from fixtures.build import ensure

    model = args.model or ensure("trained")
    drafts = {f"draft{i or ''}-n{n}": ["-md", str(d), "--spec-draft-n-max", str(n)]
              for i, d in enumerate(args.draft or [ensure("trained-draft")])
              for n in args.draft_max or [4]}
    env = C.server_env(args.blas)
    prompts = copy_prompts(model, args.prompts)
    load_before = _load()
    table = {**ROWS, **drafts}
    if args.rows:
        keep = {"plain", *args.rows.split(",")}
        table = {k: v for k, v in table.items() if k in keep}
    rows = run_rows(model, table, prompts, args.tokens, args.rounds, env,
                    args.weights)
    peer = mlx_lm_rate(model, prompts[0], args.tokens)

    base = rows["plain"]
    print(f"model {model} | {len(prompts)} copy prompts of {[len(p) for p in prompts]} tokens | "
          f"answers {[len(i) for i in base['ids']]} tokens | {args.rounds} rounds | load "
          f"{load_before} before, {_load()} after")
    print(f"{'row':<16}{'tok/s':>9}{'min-max':>14}{'vs plain':>10}{'CPU ms/tok':>12}"
          f"{'vs plain':>10}{'accepted (/metrics)':>24}{'same ids':>10}")
    for name, r in rows.items():
        acc = (f"{r['accepted']:.0f}/{r['drafted']:.0f} ({r['accepted'] / r['drafted']:.0%})"
               if r["drafted"] else "-")
        spread = "{:.0f}-{:.0f}".format(*r["spread"])
        print(f"{name:<16}{r['rate'] or 0:>9.1f}{spread:>14}{_ratio(r['rate'], base['rate']):>10}"
              f"{r['cpu_ms']:>12.2f}{_ratio(base['cpu_ms'], r['cpu_ms']):>10}{acc:>24}"
              f"{r['ids'] == base['ids']!s:>10}")
    print(f"{'mlx-lm plain':<16}{peer or 0:>9.1f}{'(after)':>14}{_ratio(peer, base['rate']):>10}")
    best = max((k for k in rows if k.startswith("ngram")), key=lambda k: rows[k]["rate"] or 0)
    by_draft = "; ".join(f"{k}: {_ratio(rows[k]['rate'], base['rate'])}" for k in drafts if k in rows)
    print(f"best n-gram ({best}) vs plain: {_ratio(rows[best]['rate'], base['rate'])} "
          f"(target >= 1.5x); {by_draft} (target >= 1.3x)")
    for k, d in drafts.items():
        print(f"  {k}: {d[1]}")
    return 0


def _load() -> list[str]:
    return Path("/proc/loadavg").read_text().split()[:3]


def _ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


if __name__ == "__main__":
    sys.exit(main())

"""Decode throughput of the sampler chain and of grammar masks, as ratios to
greedy decoding in the same run.  A benchmark, not a test: it prints numbers
and never fails on them.

    python bench/sampling.py [--fixture tiny|bench | --model DIR]
                             [--streams 1,4] [--tokens 48] [--rounds 3]
                             [--blas auto|openblas|bundled|inherit] [--json OUT]

It drives the engine's Scheduler directly (no HTTP, no trio), so what it
measures is the step: the forward pass plus everything sampling adds to
it.  For each stream count and round, every configuration decodes the same
prompts in turn (the order rotates between rounds, medians are reported):

  greedy          temperature 0: the shared argmax fast path
  default chain   upstream's defaults (temp 0.8, top_k 40, top_p 0.95, min_p 0.05)
  full chain      every stage on: penalties, DRY, top_n_sigma, top_k 0 (the whole
                  vocabulary sorted), typical, top_p, min_p, XTC, dynamic
                  temperature, min_keep, adaptive-p, and an n_probs report
  json schema     the default chain plus a JSON-schema grammar (llguidance mask
                  and upstream's rejection sampling every step)
  gbnf            the default chain plus a GBNF grammar (one-code-point terminals)

Rates are counted over the steps in which every stream is decoding; "step ms"
is the wall time of one decode step for the whole batch and "+ms/step" what
the configuration adds to greedy's step.  The tiny fixture (1.5k vocabulary,
a sub-millisecond forward pass) shows the sampling overhead at its most
visible; the bench fixture (Qwen3-0.6B shapes, 151,936-entry vocabulary)
shows it against a real forward pass on a real vocabulary size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import _common as C  # noqa: E402

SCHEMA = {"type": "object", "properties": {
    "items": {"type": "array", "minItems": 24, "items": {
        "type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                         "n": {"type": "integer"}},
        "required": ["name", "n"], "additionalProperties": False}}},
    "required": ["items"], "additionalProperties": False}
GBNF = ('root ::= "[" item ("," item){23,} "]"\n'
        'item ::= "{" [a-z ]{1,24} ":" [0-9]{1,6} "}"')


def configs():
    from mlxcel_trio.protocol.records import DEFAULT_CHAIN, SamplingParams

    full = SamplingParams(
        temperature=0.9, dynatemp_range=0.3, top_k=0, top_p=0.9, min_p=0.02, top_n_sigma=2.0,
        typical_p=0.95, xtc_probability=0.5, xtc_threshold=0.1, repeat_penalty=1.1,
        frequency_penalty=0.1, presence_penalty=0.1, dry_multiplier=0.8, min_keep=2,
        samplers=DEFAULT_CHAIN + ("adaptive_p",), adaptive_target=0.3, n_probs=5)
    return [
        ("greedy", SamplingParams(temperature=0.0), None),
        ("default chain", SamplingParams(), None),
        ("full chain", full, None),
        ("json schema", SamplingParams(), ("json_schema", json.dumps(SCHEMA))),
        ("gbnf", SamplingParams(), ("gbnf", GBNF)),
    ]


def reexec_with_blas(mode: str) -> None:
    """MLX must see OpenBLAS from process start: re-exec with LD_PRELOAD."""
    have = os.path.exists(C.OPENBLAS)
    preload = os.environ.get("LD_PRELOAD", "")
    if mode in ("auto", "openblas") and have and C.OPENBLAS not in preload:
        env = {**os.environ, "LD_PRELOAD": f"{C.OPENBLAS} {preload}".strip()}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    if mode == "bundled" and preload:
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


class Engine:
    def __init__(self, model_dir: Path) -> None:
        from mlx_lm.utils import load_model

        from mlxcel_trio.engine.vocab import Vocab
        from mlxcel_trio.grammar.compile import Compiler

        self.model, config = load_model(model_dir)
        self.vocab = Vocab(model_dir, int(config.get("vocab_size", 0)) or None)
        v = self.vocab
        t0 = time.perf_counter()
        self.compiler = Compiler(v.tokenizer_json(), v.n_vocab, v.eos_ids, v.piece,
                                 lambda t: v.tokenize(t, add_special=False, parse_special=True))
        self.tokenizer_s = time.perf_counter() - t0
        self.ids = C.vocab_ids(model_dir)

    def run(self, params, grammar, n_streams: int, tokens: int, seed: int) -> dict:
        from mlxcel_trio.protocol.records import Finished, Job, TokenPiece
        from mlxcel_trio.engine.scheduler import Scheduler
        from mlxcel_trio.grammar.compile import GrammarSpec

        compiled = self.compiler.compile(GrammarSpec(*grammar)) if grammar else None
        s = Scheduler(self.model, self.vocab, n_slots=n_streams, n_ctx_slot=tokens + 64,
                      batch_size=512)
        out: list = []
        for i in range(n_streams):
            prompt = C.make_prompt(self.ids, 16, seed * 100 + i)
            s.submit(Job(i, tuple(prompt), n_predict=tokens, grammar=compiled,
                         ignore_eos=grammar is None, sampling=params), out)
        steps: list[tuple[float, int]] = []   # (time after the step, tokens it produced)
        started: set[int] = set()
        finished_at = None
        while s.busy:
            out = []
            s.step(out)
            now = time.perf_counter()
            pieces = [e for e in out if isinstance(e, TokenPiece)]
            started.update(p.job_id for p in pieces)
            steps.append((now, len(pieces) if len(started) == n_streams else -1))
            if finished_at is None and any(isinstance(e, Finished) for e in out):
                finished_at = len(steps) - 1
        # the window: after the step where the last stream began, up to the
        # step where the first one finished
        first = next(i for i, (_, n) in enumerate(steps) if n >= 0)
        last = finished_at if finished_at is not None else len(steps) - 1
        window = steps[first + 1:last + 1]
        n_tok = sum(n for _, n in window)
        dt = window[-1][0] - steps[first][0] if window else float("nan")
        return {"tokens": n_tok, "seconds": dt, "steps": len(window),
                "rate": n_tok / dt if window and dt > 0 else float("nan"),
                "step_ms": 1e3 * dt / len(window) if window else float("nan")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixture", default="tiny", choices=("tiny", "bench"))
    ap.add_argument("--model", help="a checkpoint directory (instead of a fixture)")
    ap.add_argument("--streams", default="1,4")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--blas", default="auto", choices=("auto", "openblas", "bundled", "inherit"))
    ap.add_argument("--json", help="write every measurement here")
    args = ap.parse_args(argv)
    reexec_with_blas(args.blas)

    if args.model:
        model_dir = Path(args.model)
    else:
        from fixtures.build import ensure
        model_dir = ensure(args.fixture)
    eng = Engine(model_dir)
    streams = [int(x) for x in args.streams.split(",")]
    cfgs = configs()
    print(f"model {model_dir} (vocab {eng.vocab.n_vocab}), BLAS: {C.blas_in_use()['kind']}, "
          f"llguidance tokenizer built in {eng.tokenizer_s:.2f} s")
    for name, params, grammar in cfgs:  # warm-up: graphs, grammar compiles
        eng.run(params, grammar, max(streams), 6, seed=99)
    results: dict = {}
    for n in streams:
        for r in range(args.rounds):
            order = cfgs[r % len(cfgs):] + cfgs[:r % len(cfgs)]
            for name, params, grammar in order:
                res = eng.run(params, grammar, n, args.tokens, seed=r)
                results.setdefault((n, name), []).append(res)
    print()
    print(f"{'configuration':<16} {'streams':>7} {'tok/s':>9} {'x greedy':>9} "
          f"{'step ms':>9} {'+ms/step':>9} {'window':>8}")
    for n in streams:
        base = statistics.median(r["step_ms"] for r in results[(n, "greedy")])
        base_rate = statistics.median(r["rate"] for r in results[(n, "greedy")])
        for name, _, _ in cfgs:
            runs = results[(n, name)]
            rate = statistics.median(r["rate"] for r in runs)
            step = statistics.median(r["step_ms"] for r in runs)
            win = min(r["steps"] for r in runs)
            print(f"{name:<16} {n:>7} {rate:>9.1f} {rate / base_rate:>9.2f} {step:>9.2f} "
                  f"{step - base:>+9.2f} {win:>8}")
        print()
    if args.json:
        Path(args.json).write_text(json.dumps(
            {f"{n}:{name}": runs for (n, name), runs in results.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""LoRA adapters: what serving them unfused costs per decode step.  A
benchmark, not a test: it prints numbers and never fails on them.

    python bench/lora.py [--fixture bench | --model DIR --adapter DIR]
                         [--tokens 16] [--prompt-tokens 32] [--streams 8]
                         [--blas auto|mkl|openblas|bundled|inherit] [--json OUT]

Everything runs in this process, through the server's own scheduler and
adapted layers (mlxcel_trio/engine/lora.py); the fixture adapter
(`bench-lora`) is rank 8 on every projection of every layer.

  single stream   greedy decode tok/s, one slot: the model without adapters,
                  then with the adapter installed at scale 1 (target >= 0.85x),
                  and raw mlx-lm's `stream_generate` on the same model with the
                  same adapter applied by mlx-lm itself (`load(adapter_path=)`,
                  its LoRALinear), as the peer
  batch           `--streams` sequences decoding together, each with its own
                  scale (0.25, 0.5, ... one mix per row) against the same batch
                  with one shared scale (target >= 0.8x): aggregate tok/s over
                  the steps in which every row decodes
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import _common as C  # noqa: E402


def _reexec_with_blas(mode: str) -> None:
    """MLX picks its BLAS when it loads: preload the chosen one first."""
    env = C.blas_env(mode)
    if env.get("LD_PRELOAD", "") != os.environ.get("LD_PRELOAD", "") or \
            env.get("MLXCEL_BLAS") != os.environ.get("MLXCEL_BLAS"):
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def decode(model, vocab, prompts: list[list[int]], n: int, scales: list[tuple[float, ...]],
           n_adapters: int) -> float:
    """Aggregate decode tok/s of these prompts decoding together: tokens
    produced in the steps where every row decodes, over those steps' time."""
    from mlxcel_trio.engine.scheduler import Scheduler
    from mlxcel_trio.protocol.records import Job, SamplingParams, TokenPiece

    s = Scheduler(model, vocab, n_slots=len(prompts), n_ctx_slot=max(map(len, prompts)) + n + 8,
                  batch_size=2048, n_adapters=n_adapters)
    out: list = []
    for i, (prompt, lora) in enumerate(zip(prompts, scales)):
        s.submit(Job(i + 1, tuple(prompt), n_predict=n, sampling=SamplingParams(temperature=0.0),
                     ignore_eos=True, lora=lora), out)
    steps = []  # (time, tokens this step)
    while s.busy:
        out.clear()
        s.step(out)
        steps.append((time.perf_counter(), sum(isinstance(e, TokenPiece) for e in out)))
    full = [i for i, (_, k) in enumerate(steps) if k == len(prompts)]
    first, last = full[0], full[-1]
    tokens = sum(k for _, k in steps[first + 1:last + 1])
    return tokens / (steps[last][0] - steps[first][0])


def raw_rate(path: Path, adapter: Path | None, prompt: list[int], n: int) -> float:
    import mlx.core as mx
    from mlx_lm import load, stream_generate

    model, tok = load(str(path), adapter_path=str(adapter) if adapter else None)
    sampler = lambda x: mx.argmax(x, -1)  # noqa: E731
    times = []
    for _ in stream_generate(model, tok, prompt, max_tokens=n, sampler=sampler):
        times.append(time.perf_counter())
    return (len(times) - 1) / (times[-1] - times[0])


def measure_server(load_model, install, read_adapter, path, adapter, vocab, prompts,
                   a) -> dict:
    """The server-side rows; the models are freed when this returns."""
    model, _ = load_model(path)
    r: dict = {}
    plain, _ = load_model(path)  # a second copy: installing changes `model` in place
    adapted = install(model, [read_adapter(str(adapter))])
    decode(plain, vocab, prompts[:1], 4, [()], 0)  # warm-up
    decode(adapted, vocab, prompts[:1], 4, [(1.0,)], 1)
    mixes = [(0.25 * (i + 1),) for i in range(a.streams)]
    runs = {
        "base": lambda: decode(plain, vocab, prompts[:1], a.tokens, [()], 0),
        "adapter": lambda: decode(adapted, vocab, prompts[:1], a.tokens, [(1.0,)], 1),
        "adapter_scale_0": lambda: decode(adapted, vocab, prompts[:1], a.tokens, [(0.0,)], 1),
        "batch_shared": lambda: decode(adapted, vocab, prompts, a.tokens,
                                       [(1.0,)] * a.streams, 1),
        "batch_mixed": lambda: decode(adapted, vocab, prompts, a.tokens, mixes, 1),
    }
    for _ in range(a.rounds):  # interleaved, so a busy moment hits every configuration
        for key, run in runs.items():
            r[key] = max(r.get(key, 0.0), run())
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--fixture", default="bench", choices=("bench", "tiny"))
    src.add_argument("--model", type=Path)
    ap.add_argument("--adapter", type=Path, help="adapter directory (with --model)")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2,
                    help="measure each configuration this many times, interleaved; keep the best")
    ap.add_argument("--blas", default="auto", choices=("auto", "mkl", "openblas", "bundled",
                                                       "inherit"))
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    _reexec_with_blas(a.blas)

    from mlx_lm.utils import load_model

    from fixtures.build import ensure
    from mlxcel_trio.engine.lora import install
    from mlxcel_trio.engine.lora_files import read_adapter
    from mlxcel_trio.engine.vocab import Vocab

    if a.model and not a.adapter:
        ap.error("--model needs --adapter")
    path = a.model or ensure(a.fixture)
    adapter = a.adapter or ensure(f"{a.fixture}-lora")
    config = json.loads((path / "config.json").read_text())
    vocab = Vocab(path, int(config.get("vocab_size", 0)) or None)
    ids = C.vocab_ids(path)
    prompts = [C.make_prompt(ids, a.prompt_tokens, seed=i) for i in range(a.streams)]
    print(f"model {path} | adapter {adapter} | {a.tokens} tokens after a {a.prompt_tokens}-token "
          f"prompt | BLAS {C.blas_in_use()['kind']}", flush=True)

    r = measure_server(load_model, install, read_adapter, path, adapter, vocab, prompts, a)
    r["raw_base"] = raw_rate(path, None, prompts[0], a.tokens)
    r["raw_adapter"] = raw_rate(path, adapter, prompts[0], a.tokens)

    print(f"single stream, no adapter          {r['base']:8.2f} tok/s   raw mlx-lm "
          f"{r['raw_base']:8.2f} ({r['base'] / r['raw_base']:.2f}x)")
    print(f"single stream, adapter at scale 1  {r['adapter']:8.2f} tok/s   "
          f"{r['adapter'] / r['base']:.2f}x no adapter (target >= 0.85x); raw mlx-lm with the "
          f"adapter {r['raw_adapter']:.2f} ({r['adapter'] / r['raw_adapter']:.2f}x)")
    print(f"single stream, adapter at scale 0  {r['adapter_scale_0']:8.2f} tok/s   "
          f"{r['adapter_scale_0'] / r['base']:.2f}x no adapter (no term is computed)")
    print(f"{a.streams} streams, one shared scale     {r['batch_shared']:8.2f} tok/s")
    print(f"{a.streams} streams, {a.streams} different scales  {r['batch_mixed']:8.2f} tok/s   "
          f"{r['batch_mixed'] / r['batch_shared']:.2f}x shared (target >= 0.8x)")
    if a.json:
        a.json.write_text(json.dumps({"model": str(path), "adapter": str(adapter), **r},
                                     indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

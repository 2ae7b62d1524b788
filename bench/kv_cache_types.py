"""KV cache types (-ctk / -ctv): memory per token, agreement with the
default cache, and decode speed against raw mlx-lm.  A benchmark, not a
test: it prints numbers and never fails on them.

    python bench/kv_cache_types.py [--fixture bench|tiny-wide | --model DIR]
                                   [--context 512] [--skip 64] [--tokens 32]
                                   [--types f16,f32,bf16,q8_0,q5_0,q4_0]
                                   [--blas auto|bundled|inherit] [--json OUT]

Everything runs in this process, through the server's own cache classes
(mlxcel_trio/engine/kv_cache.py) and scheduler:

  bytes/token   one sequence's cache after `--context` tokens, all layers, K and V
  agreement     one forward pass over the same `--context` tokens per type,
                teacher-forced; at every position after `--skip`, whether the
                argmax equals the default cache's, and the largest and mean
                absolute logit difference from it
  decode tok/s  the scheduler, one slot, greedy, `--tokens` tokens after a
                `--context`-token prompt; raw mlx-lm's `generate_step` on the
                same prompt with its own cache (QuantizedKVCache with the
                same bits and group for the quantized types, its plain
                KVCache otherwise) is the ratio's denominator

q4_1 and iq4_nl store exactly as q4_0 does here, q5_1 as q5_0 (see
mlxcel_trio/protocol/kv_types.py), so they are not listed by default.
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

DEFAULT_TYPES = "f16,f32,bf16,q8_0,q5_0,q4_0"


def _reexec_with_blas(mode: str) -> None:
    """MLX picks its BLAS when it loads: preload the chosen one first."""
    env = C.blas_env(mode)
    if env.get("LD_PRELOAD", "") != os.environ.get("LD_PRELOAD", "") or \
            env.get("MLXCEL_BLAS") != os.environ.get("MLXCEL_BLAS"):
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def _cache_for(model, kv: str):
    """A one-row batch cache of the kind the scheduler builds for `kv`."""
    from mlx_lm.models.cache import BatchKVCache

    from mlxcel_trio.engine.kv_cache import BatchStoredKVCache, CacheFactory

    single = CacheFactory(model, kv, kv)()
    if single is None:
        return [BatchKVCache([0]) for _ in model.layers]
    return [BatchStoredKVCache.merge([c]) for c in single]


def forward(model, tokens: list[int], kv: str):
    import mlx.core as mx

    cache = _cache_for(model, kv)
    logits = model(mx.array(tokens)[None], cache=cache)[0].astype(mx.float32)
    mx.eval(logits)
    stored = [c.extract(0) for c in cache]
    per_token = sum(c.nbytes for c in stored) / len(tokens)
    return logits, per_token


def agreement(ref, logits, skip: int) -> dict:
    import mlx.core as mx

    a, b = ref[skip:], logits[skip:]
    same = mx.mean((mx.argmax(a, -1) == mx.argmax(b, -1)).astype(mx.float32)).item()
    diff = mx.abs(a - b)
    return {"greedy_agreement": same, "max_abs_logit_diff": mx.max(diff).item(),
            "mean_abs_logit_diff": mx.mean(diff).item()}


def decode_rate(model, vocab, prompt: list[int], kv: str, n: int) -> float:
    """Scheduler decode tok/s, one slot, from the token events' times."""
    from mlxcel_trio.engine.scheduler import Scheduler
    from mlxcel_trio.protocol.records import Finished, Job, SamplingParams

    s = Scheduler(model, vocab, n_slots=1, n_ctx_slot=len(prompt) + n + 8, batch_size=2048,
                  kv_types=(kv, kv))
    out: list = []
    s.submit(Job(1, tuple(prompt), n_predict=n, sampling=SamplingParams(temperature=0.0),
                 ignore_eos=True), out)
    while s.busy:
        s.step(out)
    (fin,) = [e for e in out if isinstance(e, Finished)]
    return 1e3 * (fin.timings.predicted_n - 1) / fin.timings.predicted_ms


def raw_rate(model, prompt: list[int], kv: str, n: int) -> float | None:
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    from mlxcel_trio.protocol.kv_types import KV_CACHE_TYPES

    fmt = KV_CACHE_TYPES[kv]
    if fmt.quantized and 32 % fmt.bits:
        return None  # mlx-lm's QuantizedKVCache sizes rows as dim // (32 // bits): wrong for 5 bits
    cache = [QuantizedKVCache(group_size=fmt.group_size, bits=fmt.bits) if fmt.quantized
             else KVCache() for _ in model.layers]
    times = []
    for _ in generate_step(mx.array(prompt), model, max_tokens=n, prompt_cache=cache,
                           sampler=lambda x: mx.argmax(x, -1)):
        times.append(time.perf_counter())
    return (len(times) - 1) / (times[-1] - times[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--fixture", default="bench", choices=("bench", "tiny-wide"))
    src.add_argument("--model", type=Path)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--skip", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--types", default=DEFAULT_TYPES)
    ap.add_argument("--blas", default="auto", choices=("auto", "mkl", "openblas", "bundled",
                                                       "inherit"))
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    _reexec_with_blas(a.blas)

    from mlx_lm.utils import load_model

    from fixtures.build import ensure
    from mlxcel_trio.engine.vocab import Vocab

    path = a.model or ensure(a.fixture)
    model, config = load_model(path)
    vocab = Vocab(path, int(config.get("vocab_size", 0)) or None)  # as the server sizes it
    prompt = C.make_prompt(C.vocab_ids(path), a.context, seed=7)
    types = a.types.split(",")
    print(f"model {path} | context {a.context} tokens | agreement after {a.skip} | "
          f"decode {a.tokens} tokens | BLAS {C.blas_in_use()['kind']}")

    ref, ref_bytes = forward(model, prompt, "f16")
    rows = []
    for kv in types:
        logits, per_token = forward(model, prompt, kv)
        row = {"type": kv, "bytes_per_token": per_token, **agreement(ref, logits, a.skip)}
        row["server_tok_s"] = decode_rate(model, vocab, prompt, kv, a.tokens)
        row["raw_tok_s"] = raw_rate(model, prompt, kv, a.tokens)
        rows.append(row)
        raw = (f"raw mlx-lm {row['raw_tok_s']:.2f} ({row['server_tok_s'] / row['raw_tok_s']:.2f}x)"
               if row["raw_tok_s"] else "raw mlx-lm n/a (its quantized cache cannot hold 5 bits)")
        print(f"{kv:>6}: {per_token / 1024:8.1f} KiB/token ({per_token / ref_bytes:.3f}x f16) | "
              f"greedy agreement {row['greedy_agreement']:.3f}, max |dlogit| "
              f"{row['max_abs_logit_diff']:.4f}, mean {row['mean_abs_logit_diff']:.5f} | decode "
              f"{row['server_tok_s']:.2f} tok/s vs {raw}", flush=True)
    if a.json:
        a.json.write_text(json.dumps({"model": str(path), "context": a.context, "rows": rows},
                                     indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

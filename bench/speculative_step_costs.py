"""Raw mlx-lm step costs of target and draft shapes, and what they allow.

    python bench/speculative_step_costs.py            # ~2 min on 2 cores

A speculative round with a draft model costs n draft steps plus one target
forward over n+1 tokens; it returns E = (1 - a^(n+1)) / (1 - a) tokens at a
per-token acceptance a.  At these sizes a forward is per-operation overhead,
not arithmetic, so the question is which (target, draft) pair has a step
ratio that lets a realistic acceptance pay.  Per shape (random weights: the
cost does not depend on their values; the trained fixture's two are the
first target and draft): one-token decode and a 3- and 5-token verify after
a 70-token prompt, with the BLAS the server picks, the rounds interleaved
over the shapes and the fastest round's median kept.  Then, per pair, the
lowest acceptance that reaches 1.3x over the target's plain decode for
n = 2 or 4 drafted tokens ("-": none below 1), and for a free n-gram draft
of 4 the lowest acceptance for 1.5x.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# (hidden, layers, heads, kv heads, intermediate); head_dim 32 throughout
TARGETS = {"3x128 (trained)": (128, 3, 4, 2, 320), "4x192": (192, 4, 6, 2, 512),
           "6x128": (128, 6, 4, 2, 320), "4x256": (256, 4, 8, 2, 704),
           "8x256": (256, 8, 8, 2, 704)}
DRAFTS = {"1x64 (trained)": (64, 1, 2, 1, 192), "2x64 (until 12-06)": (64, 2, 2, 1, 192),
          "1x32": (32, 1, 1, 1, 96)}
VERIFY = (1, 3, 5)


def build(shape):
    import mlx.core as mx
    from mlx_lm.models import qwen3

    h, layers, heads, kv, inter = shape
    args = qwen3.ModelArgs.from_dict(dict(
        model_type="qwen3", hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, head_dim=32, intermediate_size=inter, vocab_size=1037,
        rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=40960,
        tie_word_embeddings=True))
    model = qwen3.Model(args)
    mx.eval(model.parameters())
    return model


def step_ms(model, k: int, reps: int) -> float:
    """Median ms of a k-token forward on a 70-token cache, trimmed back each time."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([[5 + i for i in range(70)]]), cache=cache))
    toks, times = mx.array([[7] * k]), []
    for _ in range(reps):
        t0 = time.perf_counter()
        mx.eval(model(toks, cache=cache)[:, -1].argmax())
        times.append(time.perf_counter() - t0)
        for c in cache:
            c.trim(k)
    return sorted(times)[len(times) // 2] * 1e3


def gain(a: float, n: int, draft: float, verify: float) -> float:
    """Tokens per target-step-time of a round against plain decode (costs in target steps)."""
    tokens = n + 1 if a >= 1 else (1 - a ** (n + 1)) / (1 - a)
    return tokens / (n * draft + verify)


def needed(n: int, draft: float, verify: float, want: float = 1.3) -> str:
    for pct in range(0, 101):
        if gain(pct / 100, n, draft, verify) >= want:
            return f"{pct} %"
    return "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--blas", default="auto")
    args = ap.parse_args(argv)
    if os.environ.get("SPEC_STEP_CHILD") != "1":  # the server's BLAS, as a server would load it
        import _common as C

        env = {**C.server_env(args.blas), "SPEC_STEP_CHILD": "1"}
        return subprocess.call([sys.executable, __file__, *(argv or sys.argv[1:])], env=env)
    import mlx.core as mx

    mx.set_default_device(mx.cpu)
    shapes = {**TARGETS, **DRAFTS}
    models = {name: build(shape) for name, shape in shapes.items()}
    load = Path("/proc/loadavg").read_text().split()[:3]
    best = {name: {k: float("inf") for k in VERIFY} for name in shapes}
    for _ in range(args.rounds):
        for name, model in models.items():
            for k in VERIFY:
                best[name][k] = min(best[name][k], step_ms(model, k, args.reps))
    print(f"load {load} before, {Path('/proc/loadavg').read_text().split()[:3]} after; "
          f"{args.rounds} rounds, fastest round's median")
    print(f"{'shape':<18}{'params':>8}" + "".join(f"{f'{k} tok ms':>10}" for k in VERIFY))
    for name, model in models.items():
        from mlx.utils import tree_flatten

        n = sum(v.size for _, v in tree_flatten(model.parameters()))
        print(f"{name:<18}{n / 1e6:>7.2f}M" + "".join(f"{best[name][k]:>10.2f}" for k in VERIFY))
    print("\nlowest acceptance for 1.3x: target / draft, draft step ratio, n=2, n=4")
    for t in TARGETS:
        for d in DRAFTS:
            ratio = best[d][1] / best[t][1]
            v3, v5 = best[t][3] / best[t][1], best[t][5] / best[t][1]
            print(f"  {t:<18}{d:<20}{ratio:>6.2f}{needed(2, ratio, v3):>8}{needed(4, ratio, v5):>8}")
    print("lowest acceptance for 1.5x with a free (n-gram) draft of 4 tokens:")
    for t in TARGETS:
        print(f"  {t:<18}{needed(4, 0.0, best[t][5] / best[t][1], 1.5):>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

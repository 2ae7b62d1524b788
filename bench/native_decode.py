"""Single-stream decode on the native CPU kernels against the float32 path
and raw mlx-lm, on the same weights in the same run; and whether their
greedy tokens agree.  A benchmark, not a test: it prints, never fails.

    python bench/native_decode.py --form bf16            # bench-bf16 fixture
    python bench/native_decode.py --form 4bit --tokens 64
    python bench/native_decode.py --form 8bit            # bench-bf16 quantized in memory
    python bench/native_decode.py --model DIR --form bf16 --raw-tokens 8

Each system runs in its own process (one after the other), with the BLAS the
server would preload (bench/_common.blas_env("auto")):

- native: the stored weights on mlxcel_trio/engine/native (`--weights keep`);
  `native:exact`, `native:int16`, `native:int8` pick the affine 4-/8-bit
  kernels ($MLXCEL_NATIVE_AFFINE; docs/kernels.md), plain `native` the
  default; a `-gemm` suffix (`native-gemm`, `native:int8-gemm`) leaves the
  step's norms, rotations and attention on MLX's ops (the products alone
  on the kernels: the A/B of those nodes); a `-unfused` suffix
  (`native-unfused`) runs it with MLXCEL_NATIVE_FUSED=0, each decoder layer
  as mlx-lm's nodes instead of one fused node (the A/B of the fused layer;
  a fused run prints how many cache writes were in place or copied);
- float32: the weight policy's float32 conversion (`--weights float32`),
  today's default path on a Linux CPU;
- float32-exact (quantized forms, on request): the float32 path with the
  scales and biases widened to float32 first, so its weights are s q + b
  unrounded, as the native kernels compute them (mlx-lm's dequantize rounds
  them to the scales' dtype, bf16);
- raw mlx-lm: the checkpoint as stored on MLX's own kernels (`--raw-tokens`
  tokens only: its 4-bit CPU kernel runs ~0.2 tok/s).

With `--llama-bench BIN` (llama.cpp's llama-bench, built elsewhere) each
round also runs `llama-bench -t 2 -p 0 -n --tokens` on a GGUF of the same
weights (bench/_gguf.py: f16 for bf16, q8_0 for 8-bit, q4_0 for 4-bit,
written once under --gguf-dir), as the system `llama`.

Each greedy-decodes `--tokens` tokens after a fixed prompt with mlx-lm's
generate_step; tok/s is timed over the tokens after the first `--warmup`.
The ceiling is bytes read per token (the weights as served) over the
numpy gemv bandwidth bench/bandwidth.py measures, measured here first.
Where native and float32 tokens differ, the float32 run's top-two logit gap
at the first divergence is printed: a gap near zero is a rounding tie.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import _common as C  # noqa: E402

FIXTURE = {"bf16": "bench-bf16", "4bit": "bench-4bit", "8bit": "bench-bf16"}
GGUF_TYPE = {"bf16": "f16", "8bit": "q8_0", "4bit": "q4_0"}
GIB = 1 << 30


def _load(path: str, form: str, system: str):
    import mlx.core as mx
    from mlx import nn
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.utils import load_model

    from mlxcel_trio.engine import weights

    model = load_model(Path(path), lazy=True)[0]
    if form == "8bit" and weights.stored_form(model) == "bfloat16":
        nn.quantize(model, group_size=64, bits=8)   # what mlx_lm convert -q --q-bits 8 does
    note = None
    if system.startswith("native"):
        if system.endswith("-gemm"):
            from mlxcel_trio.engine.native import layers
            layers._install_step_ops = lambda model: None
        model, note = weights.apply(model, "keep")
    elif system == "float32-exact":   # scales and biases widened first: s q + b unrounded
        model.update(tree_unflatten([(k, v.astype(mx.float32)) for k, v in tree_flatten(
            model.parameters()) if k.endswith((".scales", ".biases"))]))
        model, note = weights.apply(model, "float32")
    elif system == "float32":
        model, note = weights.apply(model, "float32")
    mx.eval(model.parameters())
    served = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    return model, note, served


def child(spec: dict) -> dict:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    t0 = time.perf_counter()
    model, note, served = _load(spec["model"], spec["form"], spec["system"])
    load_s = time.perf_counter() - t0
    stamps, ids, gaps = [], [], []
    gen = generate_step(mx.array(spec["prompt"]), model, max_tokens=spec["tokens"],
                        sampler=lambda x: mx.argmax(x, -1))
    for tok, logprobs in gen:
        stamps.append(time.perf_counter())
        ids.append(int(tok))
        if spec["gaps"]:
            top = mx.topk(logprobs, 2)
            gaps.append(float(mx.max(top) - mx.min(top)))
    w = spec["warmup"]
    rate = (len(stamps) - 1 - w) / (stamps[-1] - stamps[w]) if len(stamps) > w + 1 else None
    if spec["system"].startswith("native"):
        from mlxcel_trio.engine.native import fused, library

        if library._graph is not None and fused.installed(model):
            nodes, donated, copied = fused.counts()
            note = (f"{note}; {nodes} fused layer nodes, cache written in place {donated}, "
                    f"copied {copied}")
    return {"system": spec["system"], "note": note, "load_s": load_s, "tok_s": rate,
            "ids": ids, "gaps": gaps, "served_bytes": served,
            "rss_peak": C.proc_status().get("VmHWM")}


def run(spec: dict, env: dict) -> dict:
    env = dict(env)
    if ":" in spec["system"]:                       # native:<affine mode>[-gemm|-unfused]
        env["MLXCEL_NATIVE_AFFINE"] = spec["system"].partition(":")[2].split("-")[0]
    if spec["system"].endswith("-unfused"):
        env["MLXCEL_NATIVE_FUSED"] = "0"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env=env,
                         capture_output=True, text=True, timeout=spec["timeout"])
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{spec['system']} failed:\n{out.stderr[-3000:]}")


def llama_bench(binary: str, gguf: Path, tokens: int, threads: int, timeout: int) -> dict:
    out = subprocess.run([binary, "-m", str(gguf), "-t", str(threads), "-p", "0", "-n",
                          str(tokens), "-r", "1", "-o", "json"], capture_output=True, text=True,
                         timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"llama-bench failed:\n{out.stderr[-3000:]}")
    r = json.loads(out.stdout)[0]
    return {"system": "llama", "note": None, "load_s": 0, "tok_s": r["avg_ts"], "ids": [],
            "gaps": [], "served_bytes": r["model_size"], "rss_peak": 0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--form", choices=sorted(FIXTURE), default="bf16")
    ap.add_argument("--model", help="checkpoint directory (default: the form's bench fixture)")
    ap.add_argument("--tokens", type=int, default=64, help="greedy tokens per system (64)")
    ap.add_argument("--warmup", type=int, default=4, help="tokens not timed (4)")
    ap.add_argument("--raw-tokens", type=int, default=6, help="tokens for raw mlx-lm; 0 skips (6)")
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--systems", default="native,float32,raw")
    ap.add_argument("--llama-bench", metavar="BIN", help="llama.cpp's llama-bench: adds `llama`")
    ap.add_argument("--llama-threads", type=int, default=2)
    ap.add_argument("--gguf-dir", type=Path, default=Path.home() / ".cache" / "mlxcel-trio" / "gguf",
                    help="where the GGUFs for --llama-bench are written (once)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the systems this many times, interleaved; medians (1)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per system (600)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        return 0

    from fixtures.build import ensure

    import bandwidth

    model = Path(args.model) if args.model else ensure(FIXTURE[args.form])
    prompt = C.make_prompt(C.vocab_ids(model), args.prompt_tokens, seed=7)
    bw = bandwidth.numpy_figures(GIB // 2, 3)["numpy gemv"]
    env = C.blas_env("auto")
    print(f"{args.form} from {model}; gemv bandwidth {bw / 1e9:.1f} GB/s; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; BLAS {C.blas_vars(env)}")
    results: dict[str, dict] = {}
    natives = [s for s in args.systems.split(",") if s.startswith("native")]
    systems = args.systems.split(",")
    if args.llama_bench:
        import _gguf

        args.gguf_dir.mkdir(parents=True, exist_ok=True)
        src = ensure("bench-bf16") if not args.model else model
        gguf = _gguf.write(src, args.gguf_dir / f"{src.name}-{GGUF_TYPE[args.form]}.gguf",
                           GGUF_TYPE[args.form])
        systems.append("llama")
    for rnd in range(args.rounds):        # rounds interleave the systems (A/B under load)
        for system in systems:
            tokens = args.raw_tokens if system == "raw" else args.tokens
            if tokens <= 0 or (system == "raw" and rnd):
                continue
            spec = {"model": str(model), "form": args.form, "system": system, "prompt": prompt,
                    "tokens": tokens, "warmup": min(args.warmup, max(tokens - 3, 0)),
                    "gaps": system.startswith("float32"), "timeout": args.timeout}
            r = (llama_bench(args.llama_bench, gguf, tokens, args.llama_threads, args.timeout)
                 if system == "llama" else run(spec, env))
            results.setdefault(system, r).setdefault("rates", []).append(r["tok_s"] or 0)
            ceiling = bw / r["served_bytes"]
            rate = r["tok_s"] or 0
            print(f"  {system:<12} {rate:6.2f} tok/s  ({r['served_bytes'] / GIB:.2f} GiB served, "
                  f"ceiling {ceiling:.1f} tok/s: {rate / ceiling:.2f} of it; load {r['load_s']:.0f}"
                  f" s, peak RSS {r['rss_peak'] / 2**20:.2f} GiB; load avg "
                  f"{os.getloadavg()[0]:.1f})", flush=True)
            if r.get("note") and not rnd:
                print(f"           {r['note']}")
    for r in results.values():
        r["tok_s"] = statistics.median(r["rates"])
    if args.rounds > 1:
        for system, r in results.items():
            print(f"  {system:<12} median {r['tok_s']:6.2f} tok/s over {len(r['rates'])} runs "
                  f"({bw / r['served_bytes'] and r['tok_s'] / (bw / r['served_bytes']):.2f} of "
                  "the ceiling)")
    for nat in natives:
        for ref in ("float32", "float32-exact", *natives):
            if ref == nat or ref not in results or (ref in natives and ref < nat):
                continue
            a, b = results[nat]["ids"], results[ref]["ids"]
            same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            if same is None:
                print(f"  greedy: {nat} == {ref} for all {min(len(a), len(b))} tokens")
                continue
            gap = results[ref]["gaps"][same] if results[ref]["gaps"] else float("nan")
            print(f"  greedy: {nat} vs {ref}: first divergence at token {same} of {len(a)} "
                  f"({ref}'s top-two logprob gap there {gap:.4f})")
        for other in ("float32", "raw", "llama"):
            if other in results and results[other]["tok_s"]:
                print(f"  {nat} / {other}: {results[nat]['tok_s'] / results[other]['tok_s']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Memory bandwidth of this machine, and what it means for decode speed.

    python bench/bandwidth.py [--model DIR | --fixture bench] [--gib 1.0] [--reps 5]

Decode reads every weight once per step, so a step can be no faster than
(bytes of weights) / (memory bandwidth).  This measures the bandwidth three
ways, in this process, on buffers far larger than any cache:

- numpy read: `arr.sum()` over a float32 array (one streaming read, both
  cores if the BLAS-free reduction threads; numpy's sum is one thread)
- numpy copy: `np.copyto(dst, src)` (read + write, counted as 2x the bytes)
- numpy gemv: a (n, 1024) float32 matrix times a vector on numpy's own
  threaded OpenBLAS: one read of the matrix, as a decode step reads a weight
- MLX read: `mx.sum` over a float32 array on the CPU stream, the same
  engine the model runs on (threads as MLX chooses)

and, given a checkpoint, the weight bytes a decode step reads in float32
(the form the server serves on a Linux CPU) and in the stored form, and the
single-stream tok/s ceiling the gemv bandwidth implies.  Prints numbers, asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

GIB = 1 << 30


def best_seconds(fn, reps: int) -> float:
    fn()  # first touch: page faults and warm-up are not bandwidth
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def numpy_figures(nbytes: int, reps: int) -> dict[str, float]:
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    read = best_seconds(lambda: src.sum(), reps)
    copy = best_seconds(lambda: np.copyto(dst, src), reps)
    # A matrix-vector product reads the matrix once, as a decode step reads
    # each weight: the figure closest to what the model can get.
    mat = src.reshape(-1, 1024)
    vec = np.ones(1024, dtype=np.float32)
    gemv = best_seconds(lambda: mat @ vec, reps)
    return {"numpy read": nbytes / read, "numpy copy": 2 * nbytes / copy,
            "numpy gemv": nbytes / gemv}


def mlx_figures(nbytes: int, reps: int) -> dict[str, float]:
    import mlx.core as mx

    mx.set_default_device(mx.cpu)
    a = mx.ones((nbytes // 4,), dtype=mx.float32)
    mx.eval(a)
    read = best_seconds(lambda: mx.eval(mx.sum(a)), reps)
    return {"MLX read": nbytes / read}


def weight_bytes(model_dir: Path) -> tuple[int, int]:
    """(bytes as stored, bytes in float32) of the checkpoint's tensors, from
    the safetensors headers (nothing is loaded).  Quantized tensors count at
    their dequantized float32 size: packed uint32 weights hold 32/bits values
    each, and their scales/biases disappear."""
    config = json.loads((model_dir / "config.json").read_text())
    bits = (config.get("quantization") or {}).get("bits")
    stored = as_f32 = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with path.open("rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            stored += end - begin
            count = int(np.prod(info["shape"])) if info["shape"] else 1
            if bits and info["dtype"] == "U32" and name.endswith(".weight"):
                as_f32 += count * (32 // bits) * 4
            elif bits and name.endswith((".scales", ".biases")):
                continue
            else:
                as_f32 += count * 4
    return stored, as_f32


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", type=Path, help="checkpoint directory")
    src.add_argument("--fixture", help="fixture checkpoint name (built on demand), e.g. bench")
    ap.add_argument("--gib", type=float, default=1.0, help="buffer size in GiB (1.0)")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions, best kept (5)")
    args = ap.parse_args()

    nbytes = int(args.gib * GIB) // 4 * 4
    figures = numpy_figures(nbytes, args.reps)
    figures.update(mlx_figures(nbytes, args.reps))
    print(f"buffer {nbytes / GIB:.2f} GiB, best of {args.reps}")
    for name, bps in figures.items():
        print(f"  {name:<11} {bps / 1e9:6.1f} GB/s")

    model = args.model
    if args.fixture:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from fixtures.build import ensure

        model = ensure(args.fixture)
    if model:
        stored, as_f32 = weight_bytes(Path(model))
        best = figures["numpy gemv"]  # the access pattern of a decode step
        print(f"checkpoint {model}")
        for label, size in (("as stored", stored), ("float32", as_f32)):
            print(f"  weights {label:<9} {size / GIB:6.2f} GiB per decode step;"
                  f" ceiling at the gemv {best / 1e9:.1f} GB/s: {best / size:5.1f} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What MLX runs on here, and what it costs: one startup line.

On a Linux CPU the mlx wheel's bundled reference BLAS is single-threaded
(~1 GFLOP/s for float32 matmul); Debian's OpenBLAS, preloaded, is ~40x
faster.  bf16 and quantized matmuls do not go through BLAS at all and stay
slow on a CPU.  Operators should learn this from the log, not from a
benchmark.
"""

from __future__ import annotations

import sys
from pathlib import Path

OPENBLAS_HINT = ("preload OpenBLAS for much faster float32 matmul: apt-get install "
                 "libopenblas0-pthread, then LD_PRELOAD=/usr/lib/x86_64-linux-gnu/"
                 "openblas-pthread/libopenblas.so.0")


def loaded_blas() -> str:
    """Which BLAS this process mapped (Linux only; 'unknown' elsewhere)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return "Accelerate" if sys.platform == "darwin" else "unknown"
    text = maps.read_text()
    if "libopenblas" in text:
        return "OpenBLAS"
    if "mlx_cpu.libs/libblas" in text or "libblas" in text:
        return "reference BLAS (single-threaded)"
    return "unknown"


def describe(device: str, dtype: str, quantization: str | None) -> tuple[str, str | None]:
    """(summary line, optional warning) for the startup log."""
    weights = quantization or dtype
    if device != "cpu":
        return f"MLX device {device}, weights {weights}", None
    blas = loaded_blas()
    line = f"MLX device cpu, weights {weights}, BLAS: {blas}"
    if quantization or dtype in ("bfloat16", "float16"):
        return line, (f"{weights} weights on a CPU do not use BLAS and run 10-100x slower "
                      "than float32 here; convert the checkpoint to float32 for speed")
    if blas.startswith("reference"):
        return line, OPENBLAS_HINT
    return line, None

"""What MLX runs on here, and what it costs: one startup line.

On a Linux CPU the mlx wheel's bundled reference BLAS is single-threaded
(~1 GFLOP/s for float32 matmul); Debian's OpenBLAS, preloaded, is ~40x
faster, and the server preloads it by itself when it finds it
(mlxcel_trio/blas.py).  bf16 and quantized matmuls do not go through BLAS at all and stay
slow on a CPU.  Operators should learn this from the log, not from a
benchmark.
"""

from __future__ import annotations

import sys
from pathlib import Path



def openblas_hint() -> str:
    from .. import blas

    return ("no faster BLAS than the mlx wheel's single-threaded one was found; float32 "
            f"matmul runs ~40x faster with MKL or OpenBLAS: {blas.install_hint()} (the "
            "server preloads it by itself at the next start)")


def loaded_blas() -> str:
    """Which BLAS this process mapped (Linux only; 'unknown' elsewhere)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return "Accelerate" if sys.platform == "darwin" else "unknown"
    text = maps.read_text()
    name = "MKL" if "libmkl_rt" in text else "OpenBLAS" if "libopenblas" in text else None
    if name is not None:
        from .. import blas

        auto = blas.preloaded()
        return f"{name} (preloaded from {auto}; --blas bundled opts out)" if auto else name
    if "mlx_cpu.libs/libblas" in text or "libblas" in text:
        return "reference BLAS (single-threaded)"
    return "unknown"


# A layer matmul under this many weight elements (1 MiB of float32) is done
# in a few microseconds on one core: splitting it costs more in thread
# hand-offs than it saves, and MKL's OpenMP threads then spin between the
# calls on cores the server's own threads need.  Measured on the 2-core
# machine, tiny fixture (64 x 128 layers): one thread took single-stream
# decode from 0.62-0.75x to 0.97x of raw mlx-lm; the 0.6B bench shape
# (1024 x 3072) decodes 2x faster on two threads than on one.
SMALL_MATMUL = 1 << 18


def small_matmuls(config: dict) -> bool:
    """Whether the model's widest layer matmul is below SMALL_MATMUL."""
    width = int(config.get("hidden_size") or 0)
    inner = int(config.get("intermediate_size") or config.get("moe_intermediate_size") or 0)
    return 0 < width * max(width, inner) < SMALL_MATMUL


def fit_blas_threads(config: dict) -> str | None:
    """One BLAS thread for a model whose matmuls are all small (see
    SMALL_MATMUL); the line that says so, or None when nothing changed."""
    from .. import blas

    if not small_matmuls(config):
        return None
    name = blas.set_threads(1)
    if name is None:
        return None
    return (f"BLAS: {name} on one thread (this model's matmuls are too small to gain from "
            f"more; {' or '.join(blas.THREAD_VARS)} chooses the count)")


def describe(device: str, dtype: str, quantization: str | None,
             blas_setting: str = "auto", on_native: bool = False) -> tuple[str, str | None]:
    """(summary line, optional warning) for the startup log.  16-bit and
    quantized weights are slow only on MLX's own CPU kernels, not on the
    native ones (engine/native)."""
    weights = quantization or dtype
    if device != "cpu":
        return f"MLX device {device}, weights {weights}", None
    blas = loaded_blas()
    line = f"MLX device cpu, weights {weights}{' on the native kernels' if on_native else ''}, " \
        f"BLAS: {blas}"
    if (quantization or dtype in ("bfloat16", "float16")) and not on_native:
        return line, (f"{weights} weights on a CPU do not use BLAS and run 10-100x slower "
                      "than float32 here; --weights float32 (or auto, when it fits in "
                      "memory) serves them in float32")
    if blas.startswith("reference") and blas_setting == "auto":
        return line, openblas_hint()
    return line, None

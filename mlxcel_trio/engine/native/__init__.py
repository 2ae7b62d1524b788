"""Native CPU kernels for MLX's 16-bit and affine 4/8-bit weights.

`status()` builds (once, cached: native/build.py) and loads the library,
checks it against numpy on a small product, and says whether it can be used
and why not; `gemm_16` / `gemm_affine` multiply float32 activations by
stored weights through it (kernels.cpp says how).  Nothing is built or
loaded before `status()` is first called, and MLXCEL_NATIVE=0 turns the
kernels off (the server then serves what the weight policy chose before
they existed: float32, or MLX's own kernels with --weights keep).

Where the mlx wheel's C++ headers and libmlx.so allow it, a product is an
MLX primitive (graph.cpp): a node of the lazy graph, evaluated on MLX's CPU
stream.  Else the library's plain C ABI is called with ctypes: each call
evaluates its input (a step's activations, small in decode) and wraps the
product in a new array.  See docs/kernels.md.
"""

from .library import (AFFINE_ENV, DTYPE_CODE, ENV, THREADS_ENV, Status, _reset_for_tests,
                      affine, available, status, threads)
from .ops import gemm_16, gemm_affine

__all__ = ["AFFINE_ENV", "affine", "DTYPE_CODE", "ENV", "THREADS_ENV", "Status", "status", "available", "gemm_16",
           "gemm_affine", "threads", "_reset_for_tests"]

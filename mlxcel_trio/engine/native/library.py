"""Building, loading and checking the kernels' library (the state behind
`status()`); ops.py calls the loaded library through `_lib`."""


from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass

import numpy as np

ENV = "MLXCEL_NATIVE"
THREADS_ENV = "MLXCEL_NATIVE_THREADS"
# The affine 4-/8-bit kernels: "int16" (the default where the CPU has
# VNNI) and "int8" round the activations to integers for VNNI dot products,
# "exact" multiplies in float32 as mx.quantized_matmul does (kernels.cpp).
AFFINE_ENV = "MLXCEL_NATIVE_AFFINE"
AFFINE_MODES = ("exact", "int8", "int16")
DTYPE_CODE = {"float32": 0, "bfloat16": 1, "float16": 2}


@dataclass(frozen=True)
class Status:
    available: bool
    detail: str          # the ISA and threads when available, else why not


_lock = threading.Lock()
_status: Status | None = None
_lib: ctypes.CDLL | None = None
# The same library through PyDLL (the GIL held: the calls touch Python
# objects) when it carries the MLX primitive (graph.cpp), else None.
_graph: ctypes.PyDLL | None = None

_P = ctypes.c_void_p
_I = ctypes.c_int


def _bind(lib: ctypes.CDLL) -> None:
    lib.mlxn_abi.restype = _I
    lib.mlxn_isa.restype = ctypes.c_char_p
    lib.mlxn_set_threads.argtypes = [_I]
    lib.mlxn_gemm_16.argtypes = [_P, _I, _I, _P, _I, _I, _P, _P]
    lib.mlxn_gemm_16.restype = _I
    lib.mlxn_gemm_affine.argtypes = [_P, _I, _I, _P, _P, _P, _I, _I, _I, _I, _P, _P]
    lib.mlxn_gemm_affine.restype = _I
    lib.mlxn_set_affine.argtypes = [_I]
    lib.mlxn_set_affine.restype = _I


def _bind_graph(lib: ctypes.PyDLL) -> None:
    lib.mlxg_abi.restype = _I
    lib.mlxg_check.argtypes = [_P, _P, _I]
    lib.mlxg_check.restype = _I
    lib.mlxg_gemm.argtypes = [_P, _P, _P, _P, _P, _P, _I, _I]
    lib.mlxg_gemm.restype = _I
    f = ctypes.c_float
    lib.mlxg_rms_norm.argtypes = [_P, _P, _P, f]
    lib.mlxg_rms_norm.restype = _I
    lib.mlxg_logsumexp.argtypes = [_P, _P]
    lib.mlxg_logsumexp.restype = _I
    lib.mlxg_rope.argtypes = [_P, _P, _I, _I, f, f, _I]
    lib.mlxg_rope.restype = _I
    lib.mlxg_decode_attention.argtypes = [_P, _P, _P, _P, f]
    lib.mlxg_decode_attention.restype = _I
    lib.mlxg_fused_layer.argtypes = [_P, _P, _P, _P]   # ctypes arrays (fused.py)
    lib.mlxg_fused_layer.restype = _I
    lib.mlxg_fused_counts.argtypes = [_P]
    lib.mlxg_fused_counts.restype = None
    lib.mlxg_widen.argtypes = [_P, _P, _I, _I]
    lib.mlxg_widen.restype = _I


def _graph_self_test(lib: ctypes.PyDLL) -> str | None:
    """The primitive reads Python's arrays and multiplies as MLX does."""
    import mlx.core as mx

    probe = mx.zeros((3, 5, 7))
    shape = (ctypes.c_int * 3)(3, 5, 7)
    if lib.mlxg_abi() != 3 or lib.mlxg_check(id(probe), shape, 3) != 0:
        return "cannot read this mlx version's arrays"
    x = mx.random.normal((2, 3, 96), key=mx.random.key(0))
    w = mx.random.normal((70, 96), key=mx.random.key(1)).astype(mx.float16)
    mx.eval(x, w)    # the kernels read weights in place: evaluated ones
    y = mx.array(0.0)
    if lib.mlxg_gemm(id(y), id(x), id(w), None, None, None, 16, 0) != 0 or y.shape != (2, 3, 70):
        return "the MLX primitive refused a valid product"
    ref = np.asarray(x) @ np.asarray(w.astype(mx.float32)).T
    if not np.allclose(np.asarray(y), ref, rtol=1e-4, atol=1e-3):
        return "the MLX primitive disagrees with numpy"
    return None


def _load_graph() -> tuple[ctypes.CDLL, ctypes.PyDLL] | str:
    """The library with the MLX primitive, or why not."""
    from .build import BuildError, graph_library

    try:
        path = str(graph_library())
        lib, glib = ctypes.CDLL(path), ctypes.PyDLL(path)
        _bind(lib)
        _bind_graph(glib)
    except (BuildError, OSError, AttributeError) as e:
        return str(e)
    if lib.mlxn_abi() != 1:
        return "the library's ABI does not match this package"
    lib.mlxn_set_threads(threads())
    problem = _self_test(lib) or _graph_self_test(glib)
    _set_affine(lib, os.environ.get(AFFINE_ENV, "int16"))
    return (lib, glib) if problem is None else problem


def threads() -> int:
    if os.environ.get(THREADS_ENV, "").isdigit():
        return max(1, int(os.environ[THREADS_ENV]))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _set_affine(lib: ctypes.CDLL, mode: str) -> str:
    """Select the affine kernels (AFFINE_MODES); returns the one in force
    ("exact" where the build has no VNNI)."""
    want = mode.strip().lower()
    return AFFINE_MODES[lib.mlxn_set_affine(AFFINE_MODES.index(want) if want in AFFINE_MODES
                                            else -1)]


def _affine_note(lib: ctypes.CDLL) -> str:
    mode = _set_affine(lib, "")
    return f"4-/8-bit {mode}" + (" (VNNI)" if mode != "exact" else "")


def affine(mode: str | None = None) -> str:
    """The affine kernels in force, after selecting `mode` when given (tests
    and benchmarks; the server takes $MLXCEL_NATIVE_AFFINE at load)."""
    if not status().available:
        raise RuntimeError(f"the native kernels are unavailable: {status().detail}")
    return _set_affine(_lib, mode or "")


def _self_test(lib: ctypes.CDLL) -> str | None:
    """A small product of each kind against numpy; None when they agree."""
    rng = np.random.default_rng(0)
    m, k, n = 3, 96, 70
    x = rng.standard_normal((m, k), dtype=np.float32)
    w16 = rng.standard_normal((n, k), dtype=np.float32).astype(np.float16)
    y = np.empty((m, n), np.float32)
    if lib.mlxn_gemm_16(x.ctypes.data, m, k, w16.ctypes.data, 2, n, None, y.ctypes.data) != 0:
        return "the 16-bit kernel refused a valid call"
    if not np.allclose(y, x @ w16.astype(np.float32).T, rtol=1e-4, atol=1e-3):
        return "the 16-bit kernel disagrees with numpy"
    q = rng.integers(0, 16, (n, k), dtype=np.uint32)
    packed = np.zeros((n, k // 8), np.uint32)
    for j in range(8):
        packed |= q[:, j::8] << (4 * j)
    s = rng.random((n, k // 32), dtype=np.float32)
    b = rng.standard_normal((n, k // 32), dtype=np.float32)
    w = q * np.repeat(s, 32, 1) + np.repeat(b, 32, 1)
    ref = x @ w.T
    for mode, tol in (("int8", 2e-2), ("int16", 1e-4), ("exact", 1e-4)):   # ends on exact
        if _set_affine(lib, mode) != mode:
            continue                    # no VNNI: int8 is not built
        if lib.mlxn_gemm_affine(x.ctypes.data, m, k, packed.ctypes.data, s.ctypes.data,
                                b.ctypes.data, 0, 4, 32, n, None, y.ctypes.data) != 0:
            return f"the 4-bit kernel ({mode}) refused a valid call"
        if not np.allclose(y, ref, rtol=tol, atol=tol * float(np.abs(ref).max())):
            return f"the 4-bit kernel ({mode}) disagrees with numpy"
    return None


def status() -> Status:
    """Build and load once per process; later calls return the first answer."""
    global _status, _lib, _graph
    with _lock:
        if _status is not None:
            return _status
        if os.environ.get(ENV, "").strip().lower() in ("0", "off", "false", "no"):
            _status = Status(False, f"turned off by {ENV}={os.environ[ENV]}")
            return _status
        from .build import BuildError, library as build_library

        graph = _load_graph()
        if not isinstance(graph, str):
            _lib, _graph = graph
            _status = Status(True, f"{_lib.mlxn_isa().decode()}, {threads()} thread(s), "
                             f"{_affine_note(_lib)}, as MLX graph nodes")
            return _status
        try:
            lib = ctypes.CDLL(str(build_library()))
            _bind(lib)
            if lib.mlxn_abi() != 1:
                raise BuildError("the library's ABI does not match this package")
            lib.mlxn_set_threads(threads())
            problem = _self_test(lib)
            if problem is not None:
                raise BuildError(problem)
            _set_affine(lib, os.environ.get(AFFINE_ENV, "int16"))
        except (BuildError, OSError) as e:
            _status = Status(False, str(e))
            return _status
        _lib = lib
        _status = Status(True, f"{lib.mlxn_isa().decode()}, {threads()} thread(s), "
                         f"{_affine_note(lib)}, through ctypes (no MLX primitive: {graph})")
        return _status


def available() -> bool:
    return status().available


def _reset_for_tests() -> None:
    global _status, _lib, _graph
    with _lock:
        _status, _lib, _graph = None, None, None

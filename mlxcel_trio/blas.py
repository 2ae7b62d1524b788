"""Which BLAS MLX's CPU backend multiplies with on Linux, chosen before MLX
loads.

The mlx wheel for Linux takes `cblas_sgemm` from the reference BLAS it
bundles: single-threaded, about 1 GFLOP/s, so float32 weights decode ~40x
slower than they need to.  Two faster ones are looked for, best first:

- Intel MKL from the Python environment (the `mkl` wheel, a dependency of
  this package on x86-64 Linux, puts libmkl_rt in <prefix>/lib).  MLX calls
  sgemm even for one row, which is what decoding is; MKL runs that shape
  near memory speed, about 3x OpenBLAS on a Qwen3-0.6B-shaped model on the
  2-core machine, and prefills as fast as OpenBLAS.
- The system's OpenBLAS (Debian's libopenblas0-pthread and its kin).
  A library named in LD_PRELOAD is searched first
and its `cblas_*` symbols win, but the dynamic loader reads LD_PRELOAD only
when a process starts.  So the server, once its command line is known to be
good and before anything imports MLX, re-executes itself with the fastest
BLAS it finds preloaded, and marks the new process so that it never does it
twice.  `--blas bundled` (or MLXCEL_BLAS=bundled) keeps the wheel's own.

Light on purpose: the standard library only.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path

ENV = "MLXCEL_BLAS"
# Set in the re-executed process: the library it preloaded.
MARK = "MLXCEL_BLAS_PRELOADED"
AUTO, BUNDLED = "auto", "bundled"


def _triplet() -> str:
    return f"{platform.machine()}-linux-gnu"


def candidates(root: Path = Path("/"), prefix: Path | None = None) -> list[Path]:
    """MKL in the Python environment, then where distributions put a
    multithreaded OpenBLAS; best first."""
    t = _triplet()
    prefix = Path(sys.prefix) if prefix is None else prefix   # read now: tests move it
    mkl = [prefix / "lib" / name for name in ("libmkl_rt.so.3", "libmkl_rt.so.2")]
    dirs = (f"usr/lib/{t}/openblas-pthread", f"usr/lib/{t}/openblas-openmp",
            f"usr/lib/{t}", "usr/lib64", "usr/lib", "usr/local/lib", "opt/OpenBLAS/lib")
    names = ("libopenblas.so.0", "libopenblasp.so.0", "libopenblas.so")
    return [*mkl, *(root / d / n for d in dirs for n in names)]


def find(root: Path = Path("/"), prefix: Path | None = None) -> Path | None:
    return next((p for p in candidates(root, prefix) if p.is_file()), None)


def install_hint(root: Path = Path("/")) -> str:
    """The exact command that installs a fast BLAS on this machine."""
    if platform.machine() == "x86_64":
        return f"{Path(sys.executable).parent / 'pip'} install mkl"
    if (root / "etc/debian_version").exists():
        return "apt-get install -y libopenblas0-pthread"
    if (root / "etc/fedora-release").exists() or (root / "etc/redhat-release").exists():
        return "dnf install -y openblas-threaded"
    if (root / "etc/arch-release").exists():
        return "pacman -S openblas"
    if (root / "etc/alpine-release").exists():
        return "apk add openblas"
    return "install your distribution's OpenBLAS package (libopenblas.so.0)"


def choose(setting: str, root: Path = Path("/"),
           prefix: Path | None = None) -> Path | None:
    """The library `--blas SETTING` preloads, or None for the bundled BLAS."""
    if setting == BUNDLED:
        return None
    if setting == AUTO:
        return find(root, prefix)
    return Path(setting)


def setting_problem(setting: str) -> str | None:
    """Why `--blas SETTING` cannot be used, or None (checked at startup)."""
    if setting in (AUTO, BUNDLED):
        return None
    path = Path(setting)
    if not path.is_file():
        return (f"no such library; give a shared library that provides cblas_sgemm "
                f"(e.g. {candidates()[0]}), or auto, or bundled")
    return None


def reexec_plan(setting: str, env: Mapping[str, str], argv: list[str],
                root: Path = Path("/"), prefix: Path | None = None,
                ) -> tuple[list[str], dict[str, str]] | None:
    """(argv, environment) to re-execute with a BLAS preloaded, or None when
    this process should go on as it is: not Linux, already re-executed,
    the bundled BLAS asked for, nothing better found, or the library
    already preloaded by the operator."""
    if not sys.platform.startswith("linux") or MARK in env:
        return None
    lib = choose(setting, root, prefix)
    if lib is None:
        return None
    preload = env.get("LD_PRELOAD", "")
    if str(lib) in preload.replace(":", " ").split():
        return None
    new_env = {**env, "LD_PRELOAD": f"{lib} {preload}".strip(), MARK: str(lib)}
    if "mkl" in lib.name:
        # bitwise-reproducible results whatever the buffers' alignment (a
        # prompt-cache hit must equal its cold run); measured free here
        new_env.setdefault("MKL_CBWR", "AUTO,STRICT")
    return argv, new_env


def reexec_if_useful(setting: str) -> None:
    """Replace this process with itself, a faster BLAS preloaded (see the
    module docstring); returns only when there is nothing to do."""
    plan = reexec_plan(setting, os.environ, list(sys.orig_argv))
    if plan is None:
        return
    argv, env = plan
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)


def preloaded() -> str | None:
    """The library this process was re-executed with, if any."""
    return os.environ.get(MARK) or None


# What an operator sets to choose the thread count themselves.
THREAD_VARS = ("MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
_SETTERS = {"MKL": "MKL_Set_Num_Threads", "OpenBLAS": "openblas_set_num_threads"}


def set_threads(n: int, env: Mapping[str, str] = os.environ) -> str | None:
    """Have the mapped MKL or OpenBLAS run its matmuls on `n` threads from
    now on; the library's name, or None when none is mapped or the
    operator chose the count with one of THREAD_VARS."""
    import ctypes

    if any(env.get(v) for v in THREAD_VARS):
        return None
    process = ctypes.CDLL(None)  # preloaded libraries' symbols are global
    for name, symbol in _SETTERS.items():
        setter = getattr(process, symbol, None)
        if setter is not None:
            setter(ctypes.c_int(n))
            return name
    return None


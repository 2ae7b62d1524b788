"""Build the native kernels (kernels.cpp) at first use, into a cache.

The library is compiled with the system's C++ compiler (`$CXX`, else c++,
g++ or clang++) for this CPU (-march=native) into
`<cache>/native/<key>/`, where the key hashes the source, the compiler's
version, MLX's version and the CPU's feature flags: a new CPU, compiler or
source gets its own build, never a stale one.  The cache is
$MLXCEL_NATIVE_CACHE, else $XDG_CACHE_HOME/mlxcel-trio (~/.cache/mlxcel-trio).
A file lock makes concurrent processes wait for one build instead of racing;
the library is written under a temporary name and renamed into place.  A
failed build is remembered under the same key (with the compiler's output),
so a server without a working compiler does not retry at every start.

Standard library only: nothing here is needed to install the package.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("kernels.cpp")
LIBRARY = "libmlxcel_kernels.so"
FAILED = "build-failed.txt"
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-pthread",
         "-fno-math-errno")
BUILD_TIMEOUT_S = 300


class BuildError(RuntimeError):
    """Why there is no library: shown in the load summary."""


def cache_root() -> Path:
    if os.environ.get("MLXCEL_NATIVE_CACHE"):
        return Path(os.environ["MLXCEL_NATIVE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mlxcel-trio" / "native"


def compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return " ".join(sorted(set(line.split(":", 1)[1].split())))
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _compiler_version(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.splitlines()[0] if out.stdout else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def key(cxx: str) -> str:
    try:
        mlx_version = importlib.metadata.version("mlx")
    except importlib.metadata.PackageNotFoundError:
        mlx_version = "?"
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(FLAGS).encode(), _compiler_version(cxx).encode(),
                 mlx_version.encode(), platform.machine().encode(), _cpu_flags().encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def library() -> Path:
    """The built library's path, building it first if needed; BuildError
    saying why when there is none."""
    if platform.system() != "Linux":
        raise BuildError(f"built on Linux only (this is {platform.system()})")
    cxx = compiler()
    if cxx is None:
        raise BuildError("no C++ compiler found (set CXX or install g++)")
    out_dir = cache_root() / key(cxx)
    lib, failed = out_dir / LIBRARY, out_dir / FAILED
    if lib.is_file():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)      # another process may be building it
        if lib.is_file():
            return lib
        if failed.is_file():
            raise BuildError(f"the build failed earlier ({failed})")
        tmp = out_dir / f".{LIBRARY}.{os.getpid()}"
        cmd = [cxx, *FLAGS, str(SOURCE), "-o", str(tmp)]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as e:
            run = None
            detail = str(e)
        if run is None or run.returncode != 0:
            detail = detail if run is None else (run.stderr or run.stdout)[-4000:]
            failed.write_text(" ".join(cmd) + "\n" + detail)
            tmp.unlink(missing_ok=True)
            raise BuildError(f"the C++ build failed ({failed})")
        os.replace(tmp, lib)
    return lib

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
Two libraries share the key's directory: the kernels alone (a plain C ABI)
and the kernels with their MLX primitive (graph.cpp, compiled against the
mlx wheel's headers and linked to its libmlx.so); library.py uses the
second when it builds and checks out, else the first.

Standard library only: nothing here is needed to install the package.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("kernels.cpp")
GRAPH_SOURCE = Path(__file__).with_name("graph.cpp")
LIBRARY = "libmlxcel_kernels.so"
GRAPH_LIBRARY = "libmlxcel_graph.so"    # kernels.cpp + graph.cpp, linked to libmlx.so
FAILED = "build-failed.txt"
GRAPH_FAILED = "graph-build-failed.txt"
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-pthread",
         "-fno-math-errno")
GRAPH_FLAGS = tuple("-std=c++20" if f == "-std=c++17" else f for f in FLAGS)
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
    for part in (SOURCE.read_bytes(), GRAPH_SOURCE.read_bytes(), " ".join(FLAGS).encode(), _compiler_version(cxx).encode(),
                 mlx_version.encode(), platform.machine().encode(), _cpu_flags().encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def mlx_dirs() -> tuple[Path, Path] | None:
    """The installed mlx wheel's C++ headers and libmlx.so directory."""
    spec = importlib.util.find_spec("mlx")
    for root in (spec.submodule_search_locations or []) if spec else []:
        inc, lib = Path(root) / "include", Path(root) / "lib"
        if (inc / "mlx" / "primitives.h").is_file() and (lib / "libmlx.so").is_file():
            return inc, lib
    return None


def _build(cmd: list[str], out_dir: Path, name: str, failed_name: str) -> Path:
    """Compile `cmd` (output appended) into out_dir/name once; a failure is
    remembered in out_dir/failed_name."""
    lib, failed = out_dir / name, out_dir / failed_name
    if lib.is_file():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)      # another process may be building it
        if lib.is_file():
            return lib
        if failed.is_file():
            raise BuildError(f"the build failed earlier ({failed})")
        tmp = out_dir / f".{name}.{os.getpid()}"
        cmd = [*cmd, "-o", str(tmp)]
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


def _target() -> tuple[str, Path]:
    if platform.system() != "Linux":
        raise BuildError(f"built on Linux only (this is {platform.system()})")
    cxx = compiler()
    if cxx is None:
        raise BuildError("no C++ compiler found (set CXX or install g++)")
    return cxx, cache_root() / key(cxx)


def library() -> Path:
    """The built kernels' library (a plain C ABI), building it first if
    needed; BuildError saying why when there is none."""
    cxx, out_dir = _target()
    return _build([cxx, *FLAGS, str(SOURCE)], out_dir, LIBRARY, FAILED)


def graph_library() -> Path:
    """The kernels plus their MLX primitive (graph.cpp), linked to the
    installed libmlx.so; BuildError when it cannot be built."""
    cxx, out_dir = _target()
    dirs = mlx_dirs()
    if dirs is None:
        raise BuildError("the mlx wheel ships no C++ headers or libmlx.so")
    inc, lib = dirs
    cmd = [cxx, *GRAPH_FLAGS, "-include", str(SOURCE), "-I", str(inc), str(GRAPH_SOURCE),
           "-L", str(lib), "-lmlx", f"-Wl,-rpath,{lib}"]
    return _build(cmd, out_dir, GRAPH_LIBRARY, GRAPH_FAILED)

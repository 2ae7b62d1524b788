"""Choosing the BLAS before MLX loads: where it is looked for, when the
server re-executes itself with it preloaded, and when it does not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mlxcel_trio import blas


def _lib(root: Path, rel: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF")
    return path


@pytest.fixture
def linux(monkeypatch, tmp_path):
    """A Linux machine whose filesystem is tmp_path and whose Python
    environment (sys.prefix) is tmp_path/venv."""
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))
    monkeypatch.setattr(blas, "_triplet", lambda: "x86_64-linux-gnu")


def test_the_pthread_openblas_is_preferred(tmp_path, linux):
    _lib(tmp_path, "usr/lib/x86_64-linux-gnu/libopenblas.so.0")
    best = _lib(tmp_path, "usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0")
    assert blas.find(tmp_path) == best


def test_mkl_in_the_python_environment_comes_first(tmp_path, linux):
    _lib(tmp_path, "usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0")
    mkl = _lib(tmp_path, "venv/lib/libmkl_rt.so.3")
    assert blas.find(tmp_path) == mkl
    plan = blas.reexec_plan("auto", {}, ["python"], tmp_path)
    assert plan is not None and plan[1]["LD_PRELOAD"] == str(mkl)
    assert plan[1]["MKL_CBWR"] == "AUTO,STRICT"   # reproducible whatever the alignment


def test_other_distributions_paths_are_found(tmp_path, linux):
    lib = _lib(tmp_path, "usr/lib64/libopenblasp.so.0")
    assert blas.find(tmp_path) == lib


def test_a_found_library_is_preloaded_once(tmp_path, linux):
    lib = _lib(tmp_path, "usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0")
    argv = ["python", "-m", "mlxcel_trio", "-m", "x"]
    plan = blas.reexec_plan("auto", {"PATH": "/bin", "LD_PRELOAD": "libother.so"}, argv, tmp_path)
    assert plan is not None
    new_argv, env = plan
    assert new_argv == argv and env["PATH"] == "/bin"
    assert env["LD_PRELOAD"] == f"{lib} libother.so" and env[blas.MARK] == str(lib)
    # the re-executed process never does it again
    assert blas.reexec_plan("auto", env, argv, tmp_path) is None


@pytest.mark.parametrize("setting", ["bundled"])
def test_bundled_never_reexecutes(tmp_path, linux, setting):
    _lib(tmp_path, "usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0")
    assert blas.reexec_plan(setting, {}, ["python"], tmp_path) is None


def test_nothing_found_means_no_reexec(tmp_path, linux):
    assert blas.reexec_plan("auto", {}, ["python"], tmp_path) is None


def test_an_operator_preload_of_the_same_library_is_left_alone(tmp_path, linux):
    lib = _lib(tmp_path, "usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0")
    assert blas.reexec_plan("auto", {"LD_PRELOAD": str(lib)}, ["python"], tmp_path) is None


def test_an_explicit_library_path_is_used(tmp_path, linux):
    lib = _lib(tmp_path, "opt/mkl/libmkl_rt.so.2")
    plan = blas.reexec_plan(str(lib), {}, ["python"], tmp_path)
    assert plan is not None and plan[1]["LD_PRELOAD"] == str(lib)
    assert blas.setting_problem(str(lib)) is None
    assert "no such library" in blas.setting_problem(str(tmp_path / "missing.so"))


def test_not_linux_means_no_reexec(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    _lib(tmp_path, "usr/lib/libopenblas.so.0")
    assert blas.reexec_plan("auto", {}, ["python"], tmp_path) is None


@pytest.mark.parametrize(("marker", "command"), [
    ("etc/debian_version", "apt-get install -y libopenblas0-pthread"),
    ("etc/fedora-release", "dnf install -y openblas-threaded"),
    ("etc/alpine-release", "apk add openblas"),
])
def test_off_x86_the_install_hint_is_the_distributions_command(tmp_path, marker, command,
                                                                monkeypatch):
    monkeypatch.setattr(blas.platform, "machine", lambda: "aarch64")
    _lib(tmp_path, marker)
    assert blas.install_hint(tmp_path) == command


def test_on_x86_the_install_hint_is_the_mkl_wheel(tmp_path, monkeypatch):
    monkeypatch.setattr(blas.platform, "machine", lambda: "x86_64")
    _lib(tmp_path, "etc/debian_version")
    assert blas.install_hint(tmp_path).endswith("pip install mkl")


# -- the thread count for small models ------------------------------------------------

_PROBE = """
import ctypes, sys
from mlxcel_trio import blas
proc = ctypes.CDLL(None)
get = getattr(proc, "MKL_Get_Max_Threads", None) or getattr(proc, "openblas_get_num_threads")
before = get()
print(blas.set_threads(1), before, get())
"""


def _probe(lib: Path, **env: str) -> list[str]:
    import os
    import subprocess

    clean = {k: v for k, v in os.environ.items() if k not in blas.THREAD_VARS}
    run = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                         timeout=60, env={**clean, "LD_PRELOAD": str(lib), **env})
    assert run.returncode == 0, run.stderr
    return run.stdout.split()


def test_set_threads_reaches_the_preloaded_library():
    lib = blas.find()
    if lib is None:
        pytest.skip("no MKL or OpenBLAS on this machine to preload")
    name, before, after = _probe(lib)
    assert name in ("MKL", "OpenBLAS") and after == "1"
    if int(before) == 1:
        pytest.skip("a one-core machine: the library starts on one thread")


def test_an_operator_thread_count_is_left_alone():
    lib = blas.find()
    if lib is None:
        pytest.skip("no MKL or OpenBLAS on this machine to preload")
    assert _probe(lib, MKL_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2") == ["None", "2", "2"]


@pytest.mark.parametrize(("config", "small"), [
    ({"hidden_size": 64, "intermediate_size": 128}, True),         # the tiny fixture
    ({"hidden_size": 256, "intermediate_size": 512}, True),
    ({"hidden_size": 576, "intermediate_size": 1536}, False),      # SmolLM2-135M
    ({"hidden_size": 1024, "intermediate_size": 3072}, False),     # Qwen3-0.6B
    ({"hidden_size": 256, "moe_intermediate_size": 768}, True),
    ({}, False),                                                   # unknown: left as it is
])
def test_only_small_matmuls_get_one_thread(config, small):
    from mlxcel_trio.engine.platform_report import small_matmuls

    assert small_matmuls(config) is small

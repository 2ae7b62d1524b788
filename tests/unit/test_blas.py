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

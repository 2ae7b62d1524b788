"""Without the kernels (turned off, no compiler, a failed build) the weight
policy keeps today's paths and says why; nothing here builds anything.

White-box: each test resets the kernels' cached probe
(`native._reset_for_tests`) so that it sees its own environment."""

from __future__ import annotations

import pytest

from mlxcel_trio.engine import native
from mlxcel_trio.engine.native import build


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("MLXCEL_NATIVE_CACHE", str(tmp_path / "cache"))
    native._reset_for_tests()
    yield
    native._reset_for_tests()


def test_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setenv(native.ENV, "0")
    st = native.status()
    assert not st.available and st.detail == "turned off by MLXCEL_NATIVE=0"


def test_no_compiler_is_said(monkeypatch):
    monkeypatch.setattr(build, "compiler", lambda: None)
    st = native.status()
    assert not st.available and "no C++ compiler found" in st.detail


def test_a_failed_build_is_said_and_remembered(monkeypatch, tmp_path):
    bad = tmp_path / "kernels.cpp"
    bad.write_text("this is not C++\n")
    monkeypatch.setattr(build, "SOURCE", bad)
    monkeypatch.setattr(build, "_compiler_version", lambda cxx: "g++ 1.0")
    st = native.status()
    assert not st.available and "the C++ build failed" in st.detail
    failed = list((tmp_path / "cache").glob(f"*/{build.FAILED}"))
    assert len(failed) == 1 and "this is not C++" in failed[0].read_text()
    native._reset_for_tests()
    calls = []
    monkeypatch.setattr(build.subprocess, "run", lambda *a, **k: calls.append(a))
    assert "failed earlier" in native.status().detail and not calls


def test_the_cache_key_follows_the_source_and_the_cpu(monkeypatch, tmp_path):
    first = build.key("c++")
    bad = tmp_path / "kernels.cpp"
    bad.write_text("// another source\n")
    monkeypatch.setattr(build, "SOURCE", bad)
    assert build.key("c++") != first
    monkeypatch.setattr(build, "_cpu_flags", lambda: "another cpu")
    assert len({first, build.key("c++")}) == 2


def test_the_policy_falls_back_to_float32_and_says_why(monkeypatch):
    from fixtures.build import ensure
    from mlx_lm.utils import load_model

    from mlxcel_trio.engine import weights

    monkeypatch.setenv(native.ENV, "off")
    monkeypatch.setattr(weights, "float32_is_faster", lambda m: (True, "measured"))
    model, note = weights.apply(load_model(ensure("tiny-bf16"), lazy=True)[0], "auto")
    assert weights.stored_form(model) is None
    assert "float32 is faster on this CPU" in note
    assert "native kernels unavailable: turned off by MLXCEL_NATIVE=off" in note
    kept, note = weights.apply(load_model(ensure("tiny-bf16"), lazy=True)[0], "keep")
    assert weights.stored_form(kept) == "bfloat16"
    assert note.startswith("weights kept as bfloat16 on MLX's own kernels")

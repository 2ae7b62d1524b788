"""The native kernels, built once (cached across runs, see
mlxcel_trio/engine/native/build.py); tests that need them skip with the reason
where this machine cannot build them.  `kernels` runs each test twice: as
MLX graph nodes (graph.cpp) and through the ctypes fallback the server takes
when the primitive cannot be built or fails its self-test.  White-box: the
fallback is forced by clearing the loaded primitive (library._graph)."""

from __future__ import annotations

import contextlib

import pytest


@pytest.fixture(params=["graph", "ctypes"])
def kernels(request, monkeypatch):
    from mlxcel_trio.engine import native
    from mlxcel_trio.engine.native import library

    st = native.status()
    if not st.available:
        pytest.skip(f"native kernels unavailable here: {st.detail}")
    if request.param == "graph":
        if library._graph is None:
            pytest.skip(f"the MLX primitive is unavailable here: {st.detail}")
    else:
        monkeypatch.setattr(library, "_graph", None)
    return native


@contextlib.contextmanager
def affine_mode(native, mode: str):
    """The affine 4-/8-bit kernels in `mode` (exact / int8 / int16) for the
    block; skips where this build has no such kernels (no VNNI)."""
    previous = native.affine()
    if native.affine(mode) != mode:
        pytest.skip(f"no {mode} affine kernels in this build (no VNNI)")
    try:
        yield mode
    finally:
        native.affine(previous)

"""The server on the native CPU kernels: the load summary says which path
runs, and a bf16 checkpoint served on them answers as its float32 form does;
without them (turned off) the load summary says so and why."""

from __future__ import annotations

import httpx
import pytest


def _greedy(srv) -> list[int]:
    j = httpx.post(f"{srv.url}/completion", json={
        "prompt": "The engine", "n_predict": 16, "temperature": 0, "n_probs": 1,
        "ignore_eos": True}, timeout=120).json()
    return [p["id"] for p in j["completion_probabilities"]]


def test_a_bf16_checkpoint_on_the_kernels_answers_as_its_float32_form(
        start_server, shared_server):
    from fixtures.build import ensure
    from mlxcel_trio.engine import native

    if not native.available():
        pytest.skip(f"native kernels unavailable here: {native.status().detail}")
    srv = start_server(ensure("tiny-bf16"), "-np", "1", "--weights", "keep",
                       env={"MLXCEL_NATIVE": "1"})
    srv.wait_for_text("weights kept as bfloat16 on the native CPU kernels")
    # the load summary names the path, and the slow-16-bit warning (which
    # holds for MLX's own CPU kernels only) is not given
    srv.wait_for_text("weights bfloat16 on the native kernels, BLAS: ")
    assert not any("do not use BLAS" in ln for ln in srv.stdout + srv.stderr)
    # the float32 reference only answers greedy requests: one per worker
    reference = shared_server(ensure("tiny-bf16-f32"), "-np", "1")
    assert _greedy(srv) == _greedy(reference)
    srv.stop()


def test_without_the_kernels_the_load_summary_says_why(start_server):
    from fixtures.build import ensure

    srv = start_server(ensure("tiny-bf16"), "-np", "1", "--weights", "keep",
                       env={"MLXCEL_NATIVE": "0"})
    srv.wait_for_text("weights kept as bfloat16 on MLX's own kernels; native kernels "
                      "unavailable: turned off by MLXCEL_NATIVE=0")
    srv.wait_for_text("bfloat16 weights on a CPU do not use BLAS")
    srv.stop()

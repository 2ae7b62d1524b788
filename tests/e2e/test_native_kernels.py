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


def test_a_bf16_draft_runs_on_the_kernels_and_changes_no_token(start_server, shared_server):
    """The weight policy serves the draft as it serves the target, and
    `--weights auto` (the default) keeps a draft on the native kernels: the
    trained draft (stored in bfloat16) runs there, where MLX's own 16-bit
    CPU kernels or float32 would make each draft step dearer than a target
    step; greedy tokens stay the plain server's, and drafts are proposed
    and kept."""
    from fixtures.build import ensure
    from mlxcel_trio.engine import native

    if not native.available():
        pytest.skip(f"native kernels unavailable here: {native.status().detail}")
    srv = start_server(ensure("trained"), "-np", "1",
                       "-md", str(ensure("trained-draft")), "--spec-draft-n-max", "3",
                       env={"MLXCEL_NATIVE": "1"})
    srv.wait_for_text("draft weights kept as bfloat16 on the native CPU kernels")
    srv.wait_for_text("(--weights auto keeps a draft on the native kernels)")
    plain = shared_server(ensure("trained"), "-np", "1")
    body = {"prompt": "<|im_start|>user\nRepeat this exactly: Nora the goat lived near the "
                      "mountain.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
            "n_predict": 24, "temperature": 0, "return_tokens": True}
    drafted = httpx.post(f"{srv.url}/completion", json=body, timeout=120).json()
    assert drafted["tokens"] == httpx.post(f"{plain.url}/completion", json=body,
                                           timeout=120).json()["tokens"]
    assert drafted["timings"]["draft_n"] > 0 and drafted["timings"]["draft_n_accepted"] > 0
    srv.stop()

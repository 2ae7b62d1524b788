"""Two callers at once (two MLX streams evaluating together) share the
kernels' worker pool safely: the one that finds it busy computes alone.

White-box: it calls the library's C entry point (library._lib) from two
threads, as two stream threads would; ctypes releases the GIL for the call.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest


def _pool_library():
    """The kernels' C library, skipping where it has no worker pool."""
    from mlxcel_trio.engine.native import library

    st = library.status()
    if not st.available:
        pytest.skip(f"native kernels unavailable here: {st.detail}")
    if library.threads() < 2:
        pytest.skip("one kernel thread: there is no pool")
    return library._lib


def _first_wrong_step(lib, x, w, dtype: int, ref, steps: int) -> int | None:
    """Repeats y = x . w^T (w 16-bit, dtype 1 bf16 / 2 f16); the first step
    whose product is refused or wrong, or None."""
    m, k = x.shape
    n = w.shape[0]
    y = np.empty((m, n), np.float32)
    for step in range(steps):
        y.fill(np.nan)
        if lib.mlxn_gemm_16(x.ctypes.data, m, k, w.ctypes.data, dtype, n, None,
                            y.ctypes.data) != 0 or not np.allclose(y, ref, rtol=1e-4, atol=1e-3):
            return step
    return None


def test_two_callers_at_once_both_get_their_own_product():
    lib = _pool_library()
    rng = np.random.default_rng(7)
    m, k, n = 2, 256, 512   # n >= 64: the rows are split across the pool
    jobs = []
    for seed in (1, 2):
        x = rng.standard_normal((m, k), dtype=np.float32) * seed
        w = rng.standard_normal((n, k), dtype=np.float32).astype(np.float16)
        jobs.append((x, w, x @ w.astype(np.float32).T))
    bad: list[str] = []

    def caller(i: int) -> None:
        step = _first_wrong_step(lib, *jobs[i][:2], 2, jobs[i][2], 300)
        if step is not None:
            bad.append(f"caller {i} step {step}")

    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a caller is stuck in the shared pool"
    assert not bad, f"wrong products with two callers at once: {bad[:3]}"


def test_a_preempted_worker_still_finishes_every_job():
    """Three runnable threads on the pool's CPUs (a GIL-holding Python loop
    beside the caller and its worker, as mlx-lm's pipelined decode builds the
    next step): the caller, done with its run, sleeps until a preempted
    worker's last chunk is done and is woken for it; every product is right
    and none hangs."""
    lib = _pool_library()
    rng = np.random.default_rng(11)
    m, k, n = 1, 1024, 8192    # 16 MiB of bf16 weights: chunks of ~1 MiB
    x = rng.standard_normal((m, k), dtype=np.float32)
    w32 = rng.standard_normal((n, k), dtype=np.float32)
    w = (w32.view(np.uint32) >> 16).astype(np.uint16)          # bf16, truncated
    ref = x @ (w.astype(np.uint32) << 16).view(np.float32).T
    stop = threading.Event()

    def spin() -> None:        # holds the GIL and a CPU between switches
        while not stop.is_set():
            sum(range(1000))

    bad: list[int] = []

    def caller() -> None:
        step = _first_wrong_step(lib, x, w, 1, ref, 150)
        if step is not None:
            bad.append(step)

    spinner = threading.Thread(target=spin, daemon=True)
    worker = threading.Thread(target=caller, daemon=True)
    spinner.start()
    worker.start()
    worker.join(timeout=60)
    stop.set()
    spinner.join(timeout=10)
    assert not worker.is_alive(), "a product never finished: the caller was not woken"
    assert not bad, f"wrong product at steps {bad}"

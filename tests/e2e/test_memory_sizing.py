"""Memory sized to the machine (mlxcel_trio/memory_fit.py), end to end: an
unset --cache-ram is sized at startup and said in the load summary, /props
serves with that figure, and a --cache-ram that cannot fit is refused
before the model loads, with its figures; /metrics reports the prompt
cache, MLX's allocator and the engine's memory releases."""

from __future__ import annotations

import re

import httpx
import pytest

from .sse import startup_refusal

pytestmark = pytest.mark.e2e

MIB = 1 << 20


def test_an_unset_cache_ram_is_sized_and_said(server):
    logged = server.wait_for_text("(sized to this machine: a quarter of the", timeout=30)
    said = re.search(r"cache_ram = (\d+) MiB \(sized to this machine: a quarter of the "
                     r"(\d+) MiB available", logged)
    assert said, logged
    mib, left = int(said.group(1)), int(said.group(2))
    assert 0 < mib <= 8192 and mib == min(8192, left // 4)
    # the load summary, logged just after the ready line
    server.wait_for_text(f"cache_ram = {mib} MiB (sized to this machine)", timeout=30)
    props = httpx.get(server.url + "/props", timeout=30).json()
    assert props["prompt_cache"]["budget_bytes"] == mib * MIB


def test_a_cache_ram_that_cannot_fit_is_refused(tiny_model):
    err = startup_refusal(tiny_model, "--cache-ram", "2000000000")
    assert "--cache-ram 2000000000: the model's 1 MiB plus a prompt cache of 2000000000 MiB " \
           "need" in err, err
    assert "is available; lower --cache-ram, or leave it unset" in err, err


def _metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines()
            if ln.startswith("mlxcel_prompt_cache")}


def test_metrics_report_the_prompt_caches_bytes_and_evictions(tiny_model, start_server):
    # tiny: 512 bytes of KV a token, so 1 MiB holds about three 600-token prompts
    srv = start_server(tiny_model, "-c", "4096", "-np", "1", "--cache-ram", "1", "--metrics")
    try:
        assert _metrics(srv.url)["mlxcel_prompt_cache_evictions_total"] == 0
        for i in range(6):
            words = " ".join(f"sizing{i}_{k}" for k in range(150))
            r = httpx.post(srv.url + "/completion", json={
                "prompt": words, "n_predict": 2, "temperature": 0}, timeout=60)
            assert r.status_code == 200, r.text
        m = _metrics(srv.url)
        cache = httpx.get(srv.url + "/props", timeout=30).json()["prompt_cache"]
        assert m["mlxcel_prompt_cache_budget_bytes"] == MIB
        assert 0 < m["mlxcel_prompt_cache_bytes"] == cache["bytes"] <= MIB
        assert m["mlxcel_prompt_cache_entries"] == cache["entries"] < 6
        # six donations, fewer entries held: the rest were evicted, and counted
        assert m["mlxcel_prompt_cache_evictions_total"] == 6 - cache["entries"]
    finally:
        srv.stop()


def _mlx_memory(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines()
            if ln.startswith(("mlxcel_mlx_", "mlxcel_memory_"))}


def _until(url: str, pred, timeout: float = 30.0) -> dict[str, float]:
    """/metrics' MLX figures once `pred` holds (the engine reports them as it
    goes idle, a moment after the answer that made it idle)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        m = _mlx_memory(url)
        if pred(m) or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


def test_mlx_memory_and_its_releases_reach_metrics(tiny_model, start_server):
    """MLX's live arrays and buffer cache, and the engine's memory releases
    (mlxcel_trio/engine/memory_release.py), reach /metrics and move with the
    work; the load summary says the cadence."""
    srv = start_server(tiny_model, "--metrics")
    try:
        said = srv.wait_for_text("memory: MLX keeps up to ", timeout=30)
        assert "go back to the system each time the engine idles and every 30 s" in said, said
        loaded = _until(srv.url, lambda m: m["mlxcel_mlx_active_bytes"] > 0)
        assert 0 < loaded["mlxcel_mlx_active_bytes"] <= loaded["mlxcel_mlx_peak_bytes"], loaded
        assert loaded["mlxcel_memory_releases_total"] >= 1, "released as it went idle"
        r = httpx.post(srv.url + "/completion", json={
            "prompt": "memory " * 200, "n_predict": 8, "temperature": 0}, timeout=60)
        assert r.status_code == 200, r.text
        after = _until(srv.url, lambda m: m["mlxcel_memory_releases_total"]
                       > loaded["mlxcel_memory_releases_total"])
        assert after["mlxcel_memory_releases_total"] > loaded["mlxcel_memory_releases_total"]
        assert after["mlxcel_mlx_peak_bytes"] >= loaded["mlxcel_mlx_peak_bytes"]
        assert after["mlxcel_mlx_cache_bytes"] == 0, "emptied as the engine went idle"
    finally:
        srv.stop()

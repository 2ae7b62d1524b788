"""Downloads from a Hub (a fake one on 127.0.0.1, through HF_ENDPOINT):
`-m owner/name`, `mlxcel download | list | rm`, and the router's
`POST /models`, with progress, and failures that leave nothing behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from ..conftest import ServerProcess
from .fake_hub import FakeHub
from .sse import EventWatcher, post

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def hub(tiny_model):
    with FakeHub({"test/tiny": tiny_model}) as h:
        yield h


def _env(hub, cache) -> dict:
    # Any of these in the caller's environment (CI sets some) would turn downloading
    # off; they are overridden rather than dropped, as ServerProcess merges os.environ.
    off = {"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0", "LLAMA_ARG_OFFLINE": "0",
           "HF_TOKEN": ""}
    return {**os.environ, **off, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(cache)}


def _mlxcel(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from mlxcel_trio.entry import mlxcel_main;"
                           "import sys; sys.exit(mlxcel_main())", *args], capture_output=True,
                          text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)


def _leftovers(cache) -> list[str]:
    """Anything in the cache a later load could take for a checkpoint."""
    return sorted(str(p.relative_to(cache)) for p in cache.glob("models--*/snapshots/*"))


def test_a_repo_id_downloads_with_progress_and_serves(hub, tmp_path, tiny_model):
    cache = tmp_path / "store"  # --model-store-root wins over the Hugging Face cache
    srv = ServerProcess("test/tiny", "-np", "1", "-c", "1024", "--model-store-root", str(cache),
                        env=_env(hub, tmp_path / "hf-cache")).start()
    try:
        progress = [ln for ln in srv.stderr if ln.startswith("downloading test/tiny: ")]
        assert progress and "(100%)" in progress[-1], srv.stderr
        r = post(srv.url, {"prompt": "hi", "n_predict": 4, "temperature": 0})
        assert r.status_code == 200 and r.json()["model"] == "test/tiny"
    finally:
        srv.stop()
    assert _leftovers(cache) == ["models--test--tiny/snapshots/" + "0123456789abcdef0123456789abcdef01234567"]


@pytest.mark.parametrize(("repo", "needle"), [
    ("test/missing", "404 Not Found: no such repository"),
    ("test/gated", "401 Unauthorized: the repository is private or gated; pass --hf-token"),
    ("test/dropped", "could not fetch it from Hugging Face"),
])
def test_failed_downloads_say_why_and_leave_nothing(hub, tmp_path, repo, needle):
    cache = tmp_path / "hub"
    proc = subprocess.run([sys.executable, "-m", "mlxcel_trio", "-m", repo, "--port", "0"],
                          capture_output=True, text=True, timeout=120, env=_env(hub, cache),
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 1 and needle in proc.stderr and "Traceback" not in proc.stderr
    assert _leftovers(cache) == []
    if repo == "test/dropped":  # the weights were cut halfway: nothing usable was kept
        assert any("resolve" in r and r.endswith(".safetensors") for r in hub.requests)


def test_mlxcel_download_list_rm(hub, tmp_path):
    cache = tmp_path / "hub"
    env = _env(hub, cache)
    got = _mlxcel(env, "download", "test/tiny")
    assert got.returncode == 0, got.stderr
    assert "downloading test/tiny:" in got.stderr and "(100%)" in got.stderr
    listed = _mlxcel(env, "list").stdout.splitlines()
    assert listed[0].split() == ["MODEL", "SIZE", "ARCHITECTURE", "DTYPE"]
    assert listed[1].split()[0] == "test/tiny" and listed[1].split()[-2:] == ["qwen3", "float32"]
    assert _mlxcel(env, "rm", "test/tiny").returncode == 0
    assert _leftovers(cache) == [] and "no MLX checkpoints" in _mlxcel(env, "list").stdout
    bad = _mlxcel(env, "rm", "../etc")
    assert bad.returncode == 1 and "one Hugging Face repo id" in bad.stderr


def test_the_router_downloads_with_progress_events(hub, tmp_path, models_root):
    cache = tmp_path / "hub"
    env = _env(hub, cache)
    port_srv = ServerProcess("unused", env=env)
    port_srv.argv = [sys.executable, "-m", "mlxcel_trio", "--models-dir", str(models_root),
                     "--host", "127.0.0.1", "--port", str(port_srv.port), "-np", "1", "-c", "1024"]
    r = port_srv.start(wait_ready=False)
    r.wait_for_line("main: router is listening")
    try:
        watcher = EventWatcher(r.url + "/models/sse", {"download_finished", "download_failed"}).start()
        for body, message in (({}, "model must be a non-empty string"),
                              ({"model": "test/missing"}, "model validation failed, unable to "
                               "download: could not fetch it from Hugging Face: 404 Not Found")):
            bad = httpx.post(r.url + "/models", json=body, timeout=60)
            assert bad.status_code == 400 and bad.json()["error"]["message"].startswith(message)
        ok = httpx.post(r.url + "/models", json={"model": "test/tiny"}, timeout=60)
        assert ok.json() == {"success": True}
        events = watcher.join()
        kinds = [e["event"] for e in events if e["model"] == "test/tiny"]
        assert kinds[0] == "status_change" and "download_progress" in kinds
        assert kinds[-1] == "download_finished", events
        last = [e for e in events if e["event"] == "download_progress"][-1]["data"]
        assert last["done"] == last["total"] > 0
        again = httpx.post(r.url + "/models", json={"model": "test/tiny"}, timeout=60)
        assert again.json()["error"]["message"] == "model 'test/tiny' already exists"
        served = post(r.url, {"model": "test/tiny", "prompt": "hi", "n_predict": 3})
        assert served.status_code == 200, served.text
    finally:
        r.stop()


@pytest.fixture
def models_root(tmp_path):
    root = tmp_path / "models"
    root.mkdir()
    return root


def test_an_unreachable_hub_fails_fast_naming_the_offline_switch(tmp_path):
    # a closed loopback port stands for a machine with no network: one refused
    # connection, not huggingface_hub's five retries (about 24 s)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0",
           "LLAMA_ARG_OFFLINE": "0", "HF_ENDPOINT": f"http://127.0.0.1:{closed}",
           "HF_HUB_CACHE": str(tmp_path / "hub")}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mlxcel_trio", "-m", "owner/name", "--port",
                           "0"], capture_output=True, text=True, timeout=60, env=env,
                          stdin=subprocess.DEVNULL)
    elapsed = time.monotonic() - started
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "the Hub cannot be reached" in proc.stderr and "HF_HUB_OFFLINE=1" in proc.stderr
    assert "Retrying" not in proc.stderr and elapsed < 10, (elapsed, proc.stderr)

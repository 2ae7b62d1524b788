"""Router mode on real processes: `mlxcel-server --models-dir DIR` without -m
serves every checkpoint under DIR through one child server per model."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading

import httpx
import pytest

from ..conftest import ServerProcess, wait_until
from .sse import EventWatcher, iter_sse_lines, post

pytestmark = pytest.mark.e2e

BODY = {"prompt": "hello there", "n_predict": 8, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory, tiny_model, tiny_wide_model):
    root = tmp_path_factory.mktemp("models")
    shutil.copytree(tiny_model, root / "alpha")
    shutil.copytree(tiny_wide_model, root / "beta")
    shutil.copytree(tiny_model, root / "gamma")
    (root / "notes").mkdir()  # no config.json: not a model
    (root / "broken").mkdir()  # a config.json, but nothing a server can load
    (root / "broken" / "config.json").write_text('{"model_type": "no-such-architecture"}')
    (root / "broken" / "model.safetensors").write_bytes(b"")
    (root / "outside").symlink_to(tiny_model)  # resolves outside the directory: skipped
    return root


class Router(ServerProcess):
    def __init__(self, models_dir, *args, env=None):
        super().__init__("unused", *args, env={"HF_HUB_CACHE": str(models_dir / ".no-hub"),
                                                **(env or {})})
        self.argv = [sys.executable, "-m", "mlxcel_trio", "--models-dir", str(models_dir),
                     "--host", "127.0.0.1", "--port", str(self.port), *args]

    def start(self, wait_ready: bool = True) -> "Router":
        super().start(wait_ready=False)
        self.wait_for_line("main: router is listening")
        return self

    def statuses(self) -> dict[str, str]:
        models = httpx.get(self.url + "/models", timeout=10).json()["data"]
        return {m["id"]: m["status"]["value"] for m in models}

    def child_pid(self, name: str) -> int:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid), "-f", "--", f"--alias {name} "],
                             capture_output=True, text=True)
        pids = [int(p) for p in out.stdout.split()]
        assert len(pids) == 1, (name, pids)
        return pids[0]


@pytest.fixture(scope="module")
def router(models_dir):
    r = Router(models_dir, "--models-max", "2", "-np", "2", "-c", "2048").start()
    yield r
    r.stop()


def _complete(r, model, **extra):
    res = post(r.url, {**BODY, "model": model, **extra})
    assert res.status_code == 200, res.text
    return res.json()


def test_the_inventory_lists_what_the_directory_holds(router):
    models = httpx.get(router.url + "/v1/models").json()
    assert models["object"] == "list"
    by_id = {m["id"]: m for m in models["data"]}
    assert set(by_id) == {"alpha", "beta", "gamma", "broken"}
    alpha = by_id["alpha"]
    assert alpha["source"] == "models_dir" and alpha["can_remove"] is False
    assert alpha["owned_by"] == "llamacpp" and alpha["object"] == "model"
    props = httpx.get(router.url + "/props").json()
    assert props["role"] == "router" and props["max_instances"] == 2
    assert props["models_autoload"] is True


def test_requests_route_by_model_and_match_a_direct_server(router, server):
    got = _complete(router, "alpha")
    assert got["model"] == "alpha"
    assert got["content"] == post(server.url, BODY).json()["content"]
    assert router.statuses()["alpha"] == "loaded"
    # GET routes name the model in the query
    props = httpx.get(router.url + "/props", params={"model": "alpha"}).json()
    assert props["model_alias"] == "alpha" and props["total_slots"] == 2
    assert httpx.get(router.url + "/slots", params={"model": "alpha"}).status_code == 200


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"prompt": "x"}, 400, "model name is missing from the request"),
    ({"prompt": "x", "model": "delta"}, 400, "model 'delta' not found"),
    ({"prompt": "x", "model": "outside"}, 400, "model 'outside' not found"),
])
def test_unknown_models_are_refused_with_upstreams_wording(router, body, status, message):
    r = post(router.url, body)
    assert r.status_code == status and r.json()["error"]["message"] == message


def test_load_and_unload_answer_as_upstream(router):
    def call(path, model):
        return httpx.post(router.url + path, json={"model": model}, timeout=30)

    r = call("/models/load", "nope")
    assert r.status_code == 404 and r.json()["error"]["message"] == "model is not found"
    r = call("/models/unload", "gamma")
    assert r.status_code == 400 and r.json()["error"]["message"] == "model is not running"
    assert call("/models/load", "gamma").json() == {"success": True}
    r = call("/models/load", "gamma")
    assert r.status_code == 400 and r.json()["error"]["message"] == "model is already running"
    wait_until(lambda: router.statuses()["gamma"], "gamma loaded", until="loaded".__eq__)
    pid = router.child_pid("gamma")
    assert call("/models/unload", "gamma").json() == {"success": True}
    wait_until(lambda: not os.path.exists(f"/proc/{pid}"), "gamma's process gone")
    assert router.statuses()["gamma"] == "unloaded"
    # no autoload: an unloaded model is refused, not loaded
    r = post(router.url + "/completion?autoload=false", {**BODY, "model": "gamma"}, path="")
    assert r.status_code == 400 and r.json()["error"]["message"] == "model is not loaded"


def test_models_max_unloads_the_least_recently_used(router):
    """The module's router runs at most 2 models: a third unloads the one
    used least recently, and its process (all its memory) goes."""
    for name, status in router.statuses().items():
        if status == "loaded":
            httpx.post(router.url + "/models/unload", json={"model": name}, timeout=30)
    wait_until(lambda: set(router.statuses().values()), "every model unloaded",
               until={"unloaded"}.__eq__)
    _complete(router, "alpha")
    _complete(router, "beta")
    pid = router.child_pid("alpha")
    _complete(router, "beta")  # beta is now the most recently used
    _complete(router, "gamma")
    wait_until(lambda: not os.path.exists(f"/proc/{pid}"),
               "alpha's process gone (its memory returned) once gamma loaded\n"
               + "".join(ln for ln in router.stdout[-60:] + router.stderr[-60:]
                         if "mlxcel.router: [" not in ln))
    statuses = router.statuses()
    assert (statuses["alpha"], statuses["beta"], statuses["gamma"]) == (
        "unloaded", "loaded", "loaded")


def test_concurrent_first_requests_load_once(router):
    if router.statuses()["gamma"] != "unloaded":
        httpx.post(router.url + "/models/unload", json={"model": "gamma"}, timeout=30)
    before = len([ln for ln in router.stdout + router.stderr if "starting gamma on port" in ln])
    wait_until(lambda: router.statuses()["gamma"], "gamma unloaded", until="unloaded".__eq__)
    results = []
    threads = [threading.Thread(target=lambda: results.append(post(
        router.url, {**BODY, "model": "gamma"}).status_code)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == [200] * 4
    starts = [ln for ln in router.stdout + router.stderr if "starting gamma on port" in ln]
    assert len(starts) == before + 1, starts


def test_a_crashed_model_reloads_while_another_keeps_streaming(router):
    _complete(router, "alpha")
    _complete(router, "beta")
    victim = router.child_pid("beta")
    frames = []
    with httpx.Client(timeout=60) as c, c.stream(
            "POST", router.url + "/completion",
            json={**BODY, "model": "alpha", "n_predict": 200, "stream": True}) as stream:
        lines = iter_sse_lines(stream)
        for line in lines:
            if line.startswith("data: "):
                frames.append(json.loads(line[6:]))
                break
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: router.statuses()["beta"], "beta seen as exited",
                   until="unloaded".__eq__)
        failed = next(m for m in httpx.get(router.url + "/models").json()["data"]
                      if m["id"] == "beta")["status"]
        assert failed["failed"] is True and failed["exit_code"] == -signal.SIGKILL
        for line in lines:
            if line.startswith("data: "):
                frames.append(json.loads(line[6:]))
    assert frames[-1]["stop"] is True and frames[-1]["tokens_predicted"] == 200
    # the next request for the crashed model starts it again
    assert _complete(router, "beta")["model"] == "beta"
    assert router.child_pid("beta") != victim


def test_a_disconnect_frees_the_childs_slot(router):
    with httpx.Client(timeout=60) as c, c.stream(
            "POST", router.url + "/completion",
            json={**BODY, "model": "alpha", "n_predict": 100000, "stream": True}) as stream:
        for line in iter_sse_lines(stream):
            if line.startswith("data: "):
                break

    def busy():
        slots = httpx.get(router.url + "/slots", params={"model": "alpha"}).json()
        return [s["id"] for s in slots if s["is_processing"]]
    wait_until(busy, "every slot of alpha free after the client left", until=lambda b: not b)


def test_a_stream_session_resumes_through_the_router(router):
    conv = "router-resume-1"
    body = {**BODY, "model": "alpha", "n_predict": 24, "stream": True}
    whole = []
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", router.url + "/completion", json=body,
                      headers={"X-Conversation-Id": conv}) as r:
            assert r.status_code == 200
            raw = b"".join(r.iter_raw())
        whole.append(raw)
        resumed = c.get(router.url + "/v1/stream", params={"conv_id": conv, "from": 10})
        assert resumed.status_code == 200, resumed.text
        assert resumed.content == raw[10:]


def test_the_api_key_guards_the_router_and_sigterm_stops_every_child(models_dir):
    r = Router(models_dir, "--api-key", "sekrit", "-np", "1", "-c", "1024").start()
    try:
        assert httpx.get(r.url + "/health").status_code == 200
        for path in ("/", "/sw.js", "/manifest.webmanifest", "/_app/version.json"):
            assert httpx.get(r.url + path).status_code == 200, path  # the UI's, keyless
        assert httpx.get(r.url + "/models").status_code == 401
        assert post(r.url, {**BODY, "model": "alpha"}).status_code == 401
        auth = {"Authorization": "Bearer sekrit"}
        assert httpx.get(r.url + "/models", headers=auth).status_code == 200
        ok = post(r.url, {**BODY, "model": "alpha"}, headers=auth)
        assert ok.status_code == 200, ok.text
        pid = r.child_pid("alpha")
        r.signal(signal.SIGTERM)
        assert r.wait(30) == 0
        wait_until(lambda: not os.path.exists(f"/proc/{pid}"), "the child gone with its router")
    finally:
        r.stop()


def test_models_dir_with_a_model_is_refused(models_dir, tiny_model):
    proc = subprocess.run([sys.executable, "-m", "mlxcel_trio", "--models-dir", str(models_dir),
                           "-m", str(tiny_model), "--port", "0"], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1 and "router mode, which has no -m/--model" in proc.stderr


def test_presets_define_configure_and_alias_models(models_dir, tiny_model, tmp_path):
    preset = tmp_path / "models.ini"
    preset.write_text(
        "; the router's presets\n"
        "[*]\n"
        "LLAMA_ARG_CTX_SIZE = 2048\n"
        "[alpha]\n"
        "parallel = 3          ; a discovered model's options\n"
        "alias = first,a\n"
        "tags = small\n"
        "load-on-startup = true\n"
        "[delta]\n"
        f"model = {tiny_model}\n"
        "n-predict = 3\n")
    r = Router(models_dir, "--models-preset", str(preset)).start()
    try:
        wait_until(lambda: r.statuses().get("alpha"), "alpha loaded at startup",
                   until="loaded".__eq__)
        listed = {m["id"]: m for m in httpx.get(r.url + "/models").json()["data"]}
        assert listed["alpha"]["aliases"] == ["first", "a"] and listed["alpha"]["tags"] == ["small"]
        assert listed["delta"]["source"] == "preset"
        props = httpx.get(r.url + "/props", params={"model": "first"}).json()  # by alias
        assert props["total_slots"] == 3 and props["default_generation_settings"]["n_ctx"] == 682
        # the [*] options reach every model, a section's only its own
        got = _complete(r, "delta", n_predict=-1)  # -1 falls back to the section's -n 3
        assert got["tokens_predicted"] == 3
    finally:
        r.stop()


def test_a_preset_with_an_unknown_key_fails_startup(models_dir, tmp_path):
    preset = tmp_path / "bad.ini"
    preset.write_text("[alpha]\nmodel-colour = red\n")
    proc = subprocess.run([sys.executable, "-m", "mlxcel_trio", "--models-preset", str(preset),
                           "--port", "0"], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 1
    assert "option 'model-colour' not recognized in preset 'alpha'" in proc.stderr


def test_cache_models_list_stream_events_and_delete_within_the_cache(models_dir, tiny_model,
                                                                     tmp_path):
    hub = tmp_path / "hub"
    snapshot = hub / "models--test--tiny" / "snapshots" / "0123abcd"
    shutil.copytree(tiny_model, snapshot)
    outside = tmp_path / "precious"
    outside.mkdir()
    (hub / "models--test--link").symlink_to(outside)  # a repository that is a link out
    r = Router(models_dir, "-np", "1", "-c", "1024", env={"HF_HUB_CACHE": str(hub)}).start()
    try:
        listed = {m["id"]: m for m in httpx.get(r.url + "/models").json()["data"]}
        assert listed["test/tiny"]["source"] == "cache" and listed["test/tiny"]["can_remove"]
        assert listed["alpha"]["can_remove"] is False
        watcher = EventWatcher(r.url + "/models/sse", {"model_remove"}).start()
        wait_until(lambda: _complete(r, "test/tiny")["model"], "the cache model served")
        for name, message in (("", "model must be a non-empty string"),
                              ("alpha", "model name=alpha is not removable (not from cache)"),
                              ("../precious", "model name=../precious is not found")):
            bad = httpx.delete(r.url + "/models", params={"model": name})
            assert bad.json()["error"]["message"] == message, bad.text
        gone = httpx.delete(r.url + "/models", params={"model": "test/tiny"}, timeout=60)
        assert gone.json() == {"success": True}
        assert not (hub / "models--test--tiny").exists() and outside.exists()
        events = watcher.join()
        seen = [(e["model"], e["event"], e.get("data", {}).get("status")) for e in events]
        assert seen == [("test/tiny", "status_change", "loading"),
                        ("test/tiny", "status_change", "loaded"),
                        ("test/tiny", "status_change", "unloaded"),
                        ("test/tiny", "model_remove", None)], seen
        assert "test/tiny" not in {m["id"] for m in httpx.get(r.url + "/models").json()["data"]}
    finally:
        r.stop()


def test_a_model_that_cannot_load_answers_503_and_nothing_else_suffers(router):
    r = post(router.url, {**BODY, "model": "broken"})
    assert r.status_code == 503
    assert r.json()["error"] == {"code": 503, "type": "unavailable_error",
                                 "message": "model name=broken failed to load"}
    broken = next(m for m in httpx.get(router.url + "/models").json()["data"]
                  if m["id"] == "broken")["status"]
    assert broken["value"] == "unloaded" and broken["failed"] is True and broken["exit_code"] == 1
    assert _complete(router, "alpha")["model"] == "alpha"


def test_no_model_and_no_models_dir_routes_over_the_model_cache(tiny_model, tmp_path):
    # upstream: a server given no model starts its router over the model cache
    hub = tmp_path / "hub"
    shutil.copytree(tiny_model, hub / "models--test--tiny" / "snapshots" / "0123abcd")
    r = Router(tmp_path, "-np", "1", "-c", "1024", env={"HF_HUB_CACHE": str(hub)})
    r.argv = [a for a in r.argv if a not in ("--models-dir", str(tmp_path))]
    assert "--models-dir" not in r.argv and "-m" not in r.argv[3:]
    r.start()
    try:
        listed = {m["id"]: m for m in httpx.get(r.url + "/models").json()["data"]}
        assert set(listed) == {"test/tiny"} and listed["test/tiny"]["source"] == "cache"
        assert _complete(r, "test/tiny")["tokens_predicted"] == 8
    finally:
        r.stop()


def test_the_inventory_lists_each_models_input_modalities(tiny_model, tmp_path):
    """architecture.input_modalities (upstream's router listing) from each
    checkpoint's config, no model loaded: a VLM takes images, a chat model
    with an audio tower and a Whisper checkpoint audio, a text model text;
    --no-mmproj in a model's preset leaves its chat model text alone.  A
    loaded child's /props then reports the same."""
    pytest.importorskip("mlx_vlm")
    from fixtures.build import ensure

    root = tmp_path / "models"
    for name, kind in (("words", "tiny"), ("pics", "tiny-vlm"), ("voice", "tiny-gemma3n"),
                       ("quiet", "tiny-gemma3n"), ("speech", "tiny-whisper")):
        shutil.copytree(ensure(kind), root / name)
    preset = tmp_path / "models.ini"
    preset.write_text("[quiet]\nno-mmproj = true\n")
    r = Router(root, "--models-preset", str(preset), "-np", "1", "-c", "1024",
               "--no-warmup").start()
    try:
        for path in ("/v1/models", "/models"):
            listed = {m["id"]: m["architecture"]
                      for m in httpx.get(r.url + path, timeout=10).json()["data"]}
            assert listed == {
                "words": {"input_modalities": ["text"], "output_modalities": ["text"]},
                "pics": {"input_modalities": ["text", "image"], "output_modalities": ["text"]},
                "voice": {"input_modalities": ["text", "audio"], "output_modalities": ["text"]},
                "quiet": {"input_modalities": ["text"], "output_modalities": ["text"]},
                "speech": {"input_modalities": ["text", "audio"],
                           "output_modalities": ["text"]},
            }, listed
        assert set(r.statuses().values()) == {"unloaded"}  # read from the configs alone
        # a rescan reads the configs again: a directory now holding a VLM lists images
        shutil.rmtree(root / "words")
        shutil.copytree(ensure("tiny-vlm"), root / "words")
        listed = {m["id"]: m["architecture"]["input_modalities"] for m in httpx.get(
            r.url + "/v1/models", params={"reload": "1"}, timeout=10).json()["data"]}
        assert listed["words"] == ["text", "image"], listed
        props = httpx.get(r.url + "/props", params={"model": "pics"}, timeout=120).json()
        assert props["modalities"] == {"vision": True, "video": False, "audio": False}
    finally:
        r.stop()

"""The basic flags and their LLAMA_ARG_* variables, observed on a running server."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from .sse import iter_sse_lines, post

pytestmark = pytest.mark.e2e


def props(srv) -> dict:
    return httpx.get(srv.url + "/props").json()


def test_env_binds_and_the_command_line_wins(tiny_model, start_server):
    srv = start_server(tiny_model, env={"LLAMA_ARG_N_PARALLEL": "2", "LLAMA_ARG_CTX_SIZE": "2048"})
    p = props(srv)
    assert p["total_slots"] == 2 and p["default_generation_settings"]["n_ctx"] == 1024
    srv.stop()
    srv = start_server(tiny_model, "-np", "1", env={"LLAMA_ARG_N_PARALLEL": "2",
                                                     "LLAMA_ARG_CTX_SIZE": "2048"})
    p = props(srv)
    assert p["total_slots"] == 1 and p["default_generation_settings"]["n_ctx"] == 2048
    srv.stop()


PLAIN = ("-np", "1")   # the defaults' server (shared_server: read-only checks)


def test_sampling_defaults_come_from_flags_else_the_checkpoint(tiny_model, start_server,
                                                               shared_server):
    params = props(shared_server(tiny_model, *PLAIN))["default_generation_settings"]["params"]
    # the fixture's generation_config.json: temperature 0.6, top_k 20, top_p 0.95
    assert (params["temperature"], params["top_k"]) == (pytest.approx(0.6), 20)
    assert params["top_p"] == pytest.approx(0.95)
    srv = start_server(tiny_model, "-np", "1", "--temp", "0", "--top-k", "7", "--top-p", "0.5",
                       "--min-p", "0.1", "-s", "42", "-n", "5")
    params = props(srv)["default_generation_settings"]["params"]
    assert (params["temperature"], params["top_k"], params["seed"]) == (0.0, 7, 42)
    assert params["top_p"] == pytest.approx(0.5) and params["min_p"] == pytest.approx(0.1)
    res = post(srv.url, {"prompt": "Hello", "ignore_eos": True}).json()
    assert res["tokens_predicted"] == 5          # -n is the request default
    res = post(srv.url, {"prompt": "Hello", "n_predict": 9, "ignore_eos": True}).json()
    assert res["tokens_predicted"] == 9          # a request's own limit wins, as upstream's
    assert res["generation_settings"]["n_predict"] == 9
    srv.stop()


def test_warmup_runs_unless_disabled(tiny_model, start_server, shared_server):
    warm = shared_server(tiny_model, *PLAIN)
    cold = start_server(tiny_model, "-np", "1", "--no-warmup")
    assert any("warming up" in line for line in warm.stdout)  # the log goes to stdout
    assert not any("warming up" in line for line in cold.stdout)
    cold.stop()


def test_sse_pings_while_a_stream_is_silent(tiny_model, start_server):
    """-b 4 and a 4000-token prompt keep the stream silent (prefill) for far
    longer than a 1 s ping interval; the per-request field overrides it."""
    srv = start_server(tiny_model, "-np", "1", "-c", "8192", "-b", "4",
                       "--sse-ping-interval", "1")

    def lines_before_first_frame(extra: dict) -> list[str]:
        with httpx.stream("POST", srv.url + "/completion", timeout=60,
                          json={"prompt": [7] * 4000, "n_predict": 1, "stream": True, **extra}) as r:
            seen = []
            for line in iter_sse_lines(r):
                if line.startswith("data: "):
                    return seen
                seen.append(line)
        return seen

    assert ":" in lines_before_first_frame({})
    assert ":" not in lines_before_first_frame({"sse_ping_interval": -1})
    srv.stop()


# one server for three independent flags: -v only adds debug lines, --tags
# only /v1/models' tags, -sp only the special tokens in the text
VERBOSE_TAGS_SPECIAL = ("-np", "1", "-v", "--tags", "alpha,beta", "-sp")


def test_verbose_logs_debug_lines(tiny_model, shared_server):
    srv = shared_server(tiny_model, *VERBOSE_TAGS_SPECIAL)
    post(srv.url, {"prompt": "x", "n_predict": 1})
    srv.wait_for_text(" D mlxcel", timeout=30)   # the log goes to stdout


def test_tags_special_and_hf_repo(tiny_model, tiny_facts, start_server, shared_server):
    srv = shared_server(tiny_model, *VERBOSE_TAGS_SPECIAL)
    assert httpx.get(srv.url + "/v1/models").json()["data"][0]["tags"] == ["alpha", "beta"]
    res = post(srv.url, {"prompt": tiny_facts["eos_prompt"], "n_predict": 64,
                         "temperature": 0}).json()
    assert res["stop_type"] == "eos" and res["content"].endswith("<|im_end|>")
    # --hf-repo resolves exactly like -m (a local checkpoint directory works)
    # and wins over -m, saying so
    srv = start_server("/nonexistent-model-dir", "--hf-repo", str(tiny_model), "-np", "1")
    res = post(srv.url, {"prompt": tiny_facts["eos_prompt"], "n_predict": 64,
                         "temperature": 0}).json()
    assert res["stop_type"] == "eos" and not res["content"].endswith("<|im_end|>")
    assert any("--hf-repo" in line and "supersedes" in line for line in srv.stderr)
    srv.stop()


def test_offline_refuses_to_download(tiny_model, tmp_path):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "mlxcel_trio", "--offline", "-m", "nobody/not-cached-model"],
        capture_output=True, text=True, timeout=60,
        env={**__import__("os").environ, "HF_HUB_CACHE": str(tmp_path)})
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "downloading is off" in proc.stderr


TUNING_ARGV = ["-c", "8192", "-ngl", "99", "-fa", "on", "--mlock", "-np", "2", "--jinja",
               "-t", "8", "--no-mmap", "--numa", "distribute", "-sm", "row"]
TUNING_ENV = {"LLAMA_ARG_CTX_SIZE": "8192", "LLAMA_ARG_N_GPU_LAYERS": "99",
              "LLAMA_ARG_FLASH_ATTN": "on", "LLAMA_ARG_MLOCK": "1", "LLAMA_ARG_N_PARALLEL": "2",
              "LLAMA_ARG_JINJA": "1", "LLAMA_ARG_THREADS": "8", "LLAMA_ARG_NO_MMAP": "1",
              "LLAMA_ARG_NUMA": "distribute", "LLAMA_ARG_SPLIT_MODE": "row"}


@pytest.mark.parametrize(("argv", "env", "origin"), [
    (TUNING_ARGV, {}, ""), ([], TUNING_ENV, " (from LLAMA_ARG_THREADS)")],
    ids=["argv", "env"])
def test_a_tuned_llama_server_command_line_serves(tiny_model, start_server, argv, env, origin):
    """Upstream's speed/memory/placement flags start the server; the ones that
    ask for something are named once, in one line, and generation works."""
    srv = start_server(tiny_model, *argv, env=env)
    lines = [ln for ln in srv.stdout + srv.stderr if "has no effect on MLX" in ln]
    assert len(lines) == 1, lines
    for shown in (f"--threads '8'{origin}", "--mlock", "--no-mmap", "--numa 'distribute'",
                  "--gpu-layers '99'"):
        assert shown in lines[0], lines[0]
    assert "--flash-attn" not in lines[0]          # on is what MLX does anyway
    # a split needs mlx.launch's processes: alone, -sm is inert and says so
    assert "--split-mode" not in lines[0]
    assert any("--split-mode 'row' has no effect in one process" in ln
               for ln in srv.stdout + srv.stderr)
    res = post(srv.url, {"prompt": "Hello", "n_predict": 4, "ignore_eos": True}).json()
    assert res["tokens_predicted"] == 4
    assert props(srv)["total_slots"] == 2
    srv.stop()


def test_every_refused_option_is_reported_in_one_run(tiny_model):
    """Three refused options (two on the command line, one from the
    environment: a quantized K beside the default V): one run names all
    three, then exits 1 before loading."""
    proc = subprocess.run(
        [sys.executable, "-m", "mlxcel_trio", "-m", str(tiny_model), "--perf", "--rpc", "h:1"],
        env={**os.environ, "LLAMA_ARG_CACHE_TYPE_K": "q4_0"}, capture_output=True, text=True,
        timeout=60, stdin=subprocess.DEVNULL)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert proc.returncode == 1, proc.stderr
    assert len(errors) == 3, proc.stderr
    for shown in ("--perf", "--rpc 'h:1'", "--cache-type-k 'q4_0' (from LLAMA_ARG_CACHE_TYPE_K): K as q4_0"):
        assert sum(shown in ln for ln in errors) == 1, (shown, errors)
    assert "listening" not in proc.stdout and "model loaded" not in proc.stdout


def _slot_zero_after_slot_one_starts(srv) -> int:
    """Serve a job on slot 0, then one on slot 1; how many tokens slot 0
    still retains (what a slot save writes) once the second has started."""
    for slot in (0, 1):
        res = post(srv.url, {"prompt": "Hello there", "n_predict": 2, "id_slot": slot,
                             "ignore_eos": True})
        assert res.status_code == 200, res.text
    saved = httpx.post(srv.url + "/slots/0?action=save", json={"filename": "zero.bin"})
    assert saved.status_code == 200, saved.text
    return saved.json()["n_saved"]


def test_unified_kv_and_idle_slot_flags_act(tiny_model, start_server, tmp_path):
    """-kvu with an explicit slot count lets each slot use the whole context
    (one shared budget: engine/kv_budget.py); auto slots turn it on even past
    -no-kvu, as upstream's do.  Under it, --cache-idle-slots (the default)
    clears an idle slot's retained tokens when another task starts (their KV
    is in the prompt cache), and --no-cache-idle-slots keeps them."""
    srv = start_server(tiny_model, "-c", "2048", "-np", "2", "-kvu", "--no-cache-idle-slots",
                       "--slot-save-path", str(tmp_path), "--no-warmup")
    p = props(srv)
    assert p["default_generation_settings"]["n_ctx"] == 2048 and p["geometry"]["kv_unified"]
    assert _slot_zero_after_slot_one_starts(srv) > 0, "--no-cache-idle-slots keeps them"
    assert not any("has no effect on MLX" in ln for ln in srv.stdout + srv.stderr)
    srv.stop()
    auto = start_server(tiny_model, "-c", "2048", "-no-kvu", "--slot-save-path",
                        str(tmp_path), "--no-warmup")
    p = props(auto)
    assert p["total_slots"] == 4 and p["default_generation_settings"]["n_ctx"] == 2048
    assert p["geometry"]["kv_unified"] is True
    assert _slot_zero_after_slot_one_starts(auto) == 0, "slot 0 was cleared"
    auto.stop()

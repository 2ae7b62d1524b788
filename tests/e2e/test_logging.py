"""Logging against real processes: the log file (0600, append, stdout keeps
only the readiness lines), --log-disable, upstream's line shape and
thresholds with the command line beating the environment, and redaction:
canary secrets from every source, pushed into the log through a request
path, must reach no sink (stdout, stderr, the log file)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys

import httpx
import pytest

from .test_auth import drained_logs

pytestmark = pytest.mark.e2e

LIFECYCLE = re.compile(r"^main: (server is listening on|model loaded) ")
STAMPED = re.compile(r"^\d+\.\d\d\.\d{3}\.\d{3} [IWED] [\w.]+: ")
CANARIES = {name: f"canary-{name}-7d31f" for name in
            ("flag", "file", "env", "envfile", "hf-flag", "hf-env")}


def log_lines(lines: list[str]) -> list[str]:
    return [ln for ln in lines if not LIFECYCLE.match(ln)]


def test_no_secret_reaches_any_sink(tiny_model, start_server, tmp_path):
    keys, env_keys, log = tmp_path / "keys", tmp_path / "env-keys", tmp_path / "server.log"
    keys.write_text(f"# {CANARIES['file']} is the file's key\n{CANARIES['file']}\n")
    env_keys.write_text(CANARIES["envfile"] + "\n")
    log.write_text("earlier run\n")
    os.chmod(log, 0o644)
    runs = []
    for sink in ("stdout", "file"):
        extra = ["--log-file", str(log)] if sink == "file" else []
        srv = start_server(tiny_model, "-c", "512", "-np", "1", "-v", *extra,
                           "--api-key", CANARIES["flag"], "--api-key-file", str(keys),
                           "--hf-token", CANARIES["hf-flag"],
                           env={"LLAMA_API_KEY": CANARIES["env"], "HF_TOKEN": CANARIES["hf-env"],
                                "LLAMA_ARG_API_KEY_FILE": str(env_keys)})
        good = {"Authorization": f"Bearer {CANARIES['file']}"}  # the key file's key works
        assert httpx.get(srv.url + "/props", headers=good, timeout=10).status_code == 200
        for secret in CANARIES.values():  # every canary into the log: path and key header
            httpx.get(f"{srv.url}/{secret}", headers=good, timeout=10)
            httpx.get(f"{srv.url}/{secret}", headers={"X-Api-Key": secret}, timeout=10)
        runs.append((sink, srv, drained_logs(srv)))
    text = log.read_text()
    assert stat.S_IMODE(os.stat(log).st_mode) == 0o600      # tightened, not inherited
    assert text.startswith("earlier run\n")                  # appended
    for sink, srv, out in runs:
        for secret in CANARIES.values():
            assert secret not in out and secret not in text, (sink, secret)
        shown = text if sink == "file" else out
        assert "done request: GET /[redacted] " in shown, sink  # the leak path was exercised
    (_, file_srv, _), = [r for r in runs if r[0] == "file"]
    assert log_lines(file_srv.stdout) == [] and "main: model loaded" in text


def test_format_flags_and_command_line_beats_environment(tiny_model, start_server):
    # -lv 2 on the command line beats LLAMA_ARG_LOG_VERBOSITY=5: warnings only
    srv = start_server(tiny_model, "-c", "512", "-np", "1", "-lv", "2", "--no-log-timestamps",
                       "--log-colors", "on", env={"LLAMA_ARG_LOG_VERBOSITY": "5",
                                                   "LLAMA_ARG_LOG_COLORS": "off"})
    httpx.get(srv.url + "/props", timeout=10)
    lines = log_lines(drained_logs(srv) and srv.stdout)
    assert lines and all(ln.startswith("\033[35mW ") for ln in lines), lines
    assert any("CORS allows every origin" in ln for ln in lines)
    # -v beats -lv 1; no prefix drops the level and the timestamp
    srv = start_server(tiny_model, "-c", "512", "-np", "1", "-v", "-lv", "1", "--no-log-prefix")
    httpx.get(srv.url + "/slots", timeout=10)
    lines = log_lines(drained_logs(srv) and srv.stdout)
    assert "mlxcel.http: done request: GET /slots 127.0.0.1 200\n" in lines  # trace level
    assert all(re.match(r"^[\w.]+: ", ln) or not ln.strip() or ln.startswith((" ", "\t"))
               for ln in lines if "Traceback" not in ln), lines


def test_default_format_and_no_trace_at_info(server):
    # a record's own continuation lines (a warning's source line) start with space
    lines = [ln for ln in log_lines(server.stdout) if ln.strip() and not ln[0].isspace()]
    assert lines and all(STAMPED.match(ln) for ln in lines), lines
    assert not any("\033[" in ln for ln in lines)  # auto: a pipe gets no colors
    httpx.get(server.url + "/slots", timeout=10)
    assert not any("done request" in ln for ln in server.stdout)  # trace is threshold 4


def test_log_disable_leaves_only_the_readiness_lines(tiny_model, start_server):
    srv = start_server(tiny_model, "-c", "512", "-np", "1", "-v", "--log-disable")
    httpx.get(srv.url + "/nope", timeout=10)
    drained_logs(srv)
    assert log_lines(srv.stdout) == [] and srv.stderr == []
    assert [ln.split(" on ")[0].split(" (")[0] for ln in srv.stdout] == \
        ["main: server is listening", "main: model loaded"]


@pytest.mark.parametrize(("argv", "env", "needle"), [
    (["--log-colors", "On"], {}, "invalid value 'On' for --log-colors"),
    ([], {"LLAMA_ARG_LOG_COLORS": "yes"}, "(from LLAMA_ARG_LOG_COLORS)"),
    (["--log-file", "/nonexistent-dir/x.log"], {}, "--log-file '/nonexistent-dir/x.log': "),
])
def test_bad_log_settings_stop_startup_before_the_model(argv, env, needle):
    proc = subprocess.run([sys.executable, "-m", "mlxcel_trio", *argv, "-m", "nobody-xyz/none"],
                          capture_output=True, text=True, timeout=30,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **env})
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and needle in proc.stderr and "nobody-xyz" not in proc.stderr

"""Every llama-server option, one at a time, against the real entry point.

For each entry of upstream's options.json (plus --rpc) the option is given
alone with a plausible non-default value, next to ``-m <tiny fixture>``:

* a value we refuse must stop the real `mlxcel-server` process within
  1.5 s, exit non-zero, and print exactly one ``error:`` line naming the
  option (a classification refusal, never an "invalid value" one: the
  plausible values are all inside the option's domain);
* a value we accept (options we act on, inert forms) goes through the same
  parse -> validate -> resolve -> config path in-process, without starting
  a server; and one real server is started with every inert form at once,
  to show a llama-server command line made of them reaches "listening";
* the print-and-exit options exit 0 without a model.

The subprocesses run in a thread pool of four; each is a refusal that
exits before anything heavy is imported, so the file stays well inside its
time budget on two cores.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from mlxcel_trio.cli.main import prepare
from mlxcel_trio.cli.parser import CliError
from tests.unit.cli._upstream import (
    LIVE,
    expect_accepted,
    needs_upstream,
    ours,
    plausible,
    record_id,
    records,
)

pytestmark = [pytest.mark.e2e, needs_upstream]

SERVER = Path(sys.executable).parent / "mlxcel-server"
REFUSAL_BOUND_S = 1.0  # CPU seconds: "exits within a second" on an idle machine
WALL_BOUND_S = 10.0    # a hang, whatever the machine's load
RECORDS = records()
ACTIONS = [r for r in RECORDS if ours(r).kind == "action"]
ACCEPTED = [r for r in RECORDS if ours(r).kind != "action" and expect_accepted(r)]
REFUSED = [r for r in RECORDS if ours(r).kind != "action" and not expect_accepted(r)]


def _env(**extra: str) -> dict[str, str]:
    """This environment without anything llama-server or the Hub would read
    as an option."""
    drop = ("LLAMA_", "HF_TOKEN", "MTMD_BACKEND_DEVICE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(extra)
    return env


RUN_BOUND_S = 60.0


def _run(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run one process; `seconds` is the CPU time it used (user + sys), which
    parallel runs on a small machine cannot inflate the way wall time is."""
    start = time.monotonic()
    proc = subprocess.Popen([str(SERVER), *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            stdin=subprocess.DEVNULL)
    # a process that starts serving instead of refusing would never exit:
    # bounded, it is killed and fails its test on its exit status
    killer = threading.Timer(RUN_BOUND_S, proc.kill)
    killer.start()
    try:
        out, err = proc.stdout.read(), proc.stderr.read()  # stderr is one short line
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        killer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"rc": proc.returncode, "stdout": out, "stderr": err,
            "seconds": usage.ru_utime + usage.ru_stime,
            "wall": time.monotonic() - start, "argv": argv}


@pytest.fixture(scope="module")
def some_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("inventory") / "some.file"
    path.write_text("{}")
    return path


@pytest.fixture(scope="module")
def runs(tiny_model: Path, some_file: Path, tmp_path_factory: pytest.TempPathFactory
         ) -> dict[str, dict[str, Any]]:
    """Every refusal and action, run as real processes, four at a time."""
    if not SERVER.exists():
        pytest.skip("the mlxcel-server console script is not installed in this venv")
    cache = str(tmp_path_factory.mktemp("empty-hub"))
    jobs = {record_id(r): ([*plausible(r, some_file, tiny_model), "-m", str(tiny_model),
                            "--port", "0"], _env()) for r in REFUSED}
    jobs.update({record_id(r): (plausible(r, some_file, tiny_model), _env(HF_HUB_CACHE=cache))
                 for r in ACTIONS})
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {key: pool.submit(_run, argv, env) for key, (argv, env) in jobs.items()}
        return {key: future.result() for key, future in futures.items()}


@pytest.mark.parametrize("rec", REFUSED, ids=record_id)
def test_refusal_is_one_fast_line_naming_the_option(
    rec: dict[str, Any], runs: dict[str, dict[str, Any]]
) -> None:
    run = runs[record_id(rec)]
    opt = ours(rec)
    lines = run["stderr"].splitlines()
    assert run["rc"] != 0, run
    assert run["seconds"] < REFUSAL_BOUND_S and run["wall"] < WALL_BOUND_S, run
    assert run["stdout"] == "" and len(lines) == 1, run
    line = lines[0]
    assert line.startswith("error: "), line
    named = line.removeprefix("error: ").split(" ")[0].rstrip(":")
    assert named in opt.all_spellings, line
    assert "invalid value" not in line and "invalid argument" not in line, line
    if opt.takes_value:
        value = " ".join(run["argv"][1:1 + opt.nargs])
        assert repr(value) in line, line


@pytest.mark.parametrize("rec", ACCEPTED, ids=record_id)
def test_accepted_value_reaches_a_config(rec: dict[str, Any], tiny_model: Path,
                                         some_file: Path) -> None:
    argv = plausible(rec, some_file, tiny_model)
    if ours(rec).dest in ("models_dir", "models_preset"):  # router mode: no -m
        if ours(rec).dest == "models_preset":
            preset = some_file.parent / "models.ini"
            preset.write_text(f"[tiny]\nmodel = {tiny_model}\n")
            argv = [argv[0], str(preset)]
        config = prepare(argv, env={})
        assert config.router and config.model == ""
        return
    if ours(rec).dest == "hf_repo":
        argv = [argv[0], str(tiny_model)]  # resolved exactly like -m: a local dir works
    elif ours(rec).dest != "model":
        argv += ["-m", str(tiny_model)]
    if ours(rec).dest in ("ssl_key_file", "ssl_cert_file"):
        # one half of the TLS pair alone is refused (the pair: tests/e2e/test_transport.py)
        with pytest.raises(CliError, match="HTTPS needs both"):
            prepare(argv, env={})
        return
    config = prepare(argv, env={})
    assert config.model == str(tiny_model.resolve())


@pytest.mark.parametrize("rec", ACTIONS, ids=record_id)
def test_print_and_exit_options_need_no_model(rec: dict[str, Any],
                                              runs: dict[str, dict[str, Any]]) -> None:
    run = runs[record_id(rec)]
    assert run["rc"] == 0 and run["seconds"] < REFUSAL_BOUND_S, run
    assert run["stdout"] or run["stderr"]  # --version writes to stderr, as upstream
    assert "error" not in run["stderr"]


def test_every_inert_form_at_once_starts_the_server(
    tiny_model: Path, some_file: Path, start_server: Any
) -> None:
    inert = [r for r in ACCEPTED if ours(r).status not in LIVE]
    argv = [a for r in inert for a in plausible(r, some_file, tiny_model)]
    srv = start_server(tiny_model, *argv, env=_env(), wait_ready=False)
    srv.wait_for_line("main: server is listening", timeout=60)
    srv.signal(signal.SIGTERM)
    assert srv.wait(15) == 0
    assert not any("Traceback" in line for line in srv.stdout + srv.stderr), \
        "".join(srv.stdout + srv.stderr)

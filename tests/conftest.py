"""Shared test fixtures: fixture checkpoints and real server processes.

End-to-end tests start the real `mlxcel-server` (via `python -m mlxcel_trio`,
the same entry point) on a free 127.0.0.1 port and wait for its lifecycle
lines on stdout with a bounded wait; nothing sleeps to synchronize.  State
that only a request can show (/slots, a stored response) is polled with
`wait_until`: bounded, a short pause between tries, and a failure that says
what never happened and what was seen last.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from tests.diag import kernel_sockets
from tests.diag.sitecustomize import TASKS_HEADER

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
READY_LINE = "main: model loaded"
START_TIMEOUT_S = 120
WAIT_S = 30.0     # wait_until's default bound
POLL_S = 0.02     # its pause between tries: short, yet no spinning against the server

T = TypeVar("T")

# Every server started here prints its threads' stacks on SIGUSR1 and its
# trio tasks' await stacks on SIGUSR2 (tests/diag/sitecustomize.py), and
# runs the request watchdog with a short bound: a request without progress
# for WATCHDOG_S is logged once with its task's await stack, while it is
# stuck.  A failed end-to-end test's report carries the stacks, each
# server's last log lines and every watchdog report the server logged
# (pytest_runtest_makereport below).
WATCHDOG_S = 20
DIAG_ENV = {"MLXCEL_TEST_STACKS": "1", "MLXCEL_REQUEST_WATCHDOG_S": str(WATCHDOG_S),
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT / "tests" / "diag"), os.environ.get("PYTHONPATH")) if p)}
WATCHDOG_MARK = ": no progress for "   # server/http/watchdog.py's report line
LIVE: list[ServerProcess] = []   # servers started in this worker, in order
REPORT_LINES = 150   # log lines; the stacks (stderr) come whole, up to STACK_LINES
STACK_LINES = 600


def wait_until(probe: Callable[[], T], what: str, timeout: float = WAIT_S, *,
               until: Callable[[T], object] = bool, pause: float = POLL_S) -> T:
    """Call `probe` until `until(value)` holds and return that value; after
    `timeout` seconds fail, naming `what` and the last value seen."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if until(value):
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not reached within {timeout} s; last seen: {value!r}")
        time.sleep(pause)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A real server process; `url` once `start()` returned."""

    def __init__(self, model: Path | str, *args: str, env: dict | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [sys.executable, "-m", "mlxcel_trio", "-m", str(model),
                     "--host", "127.0.0.1", "--port", str(self.port), *args]
        # The reference BLAS, as in this process: tests compare the server's
        # numbers with references computed here, and a faster BLAS picks other
        # kernels per shape (exact only within one library).  Tests of the
        # BLAS choice itself pass their own MLXCEL_BLAS.  Likewise the
        # float32 path for 16-bit and quantized weights, not the native
        # kernels (whose `auto` choice is a timing, so it could change from
        # run to run); the kernels' own tests ask for them (MLXCEL_NATIVE=1).
        self.env = {**os.environ, "MLXCEL_BLAS": "bundled", "MLXCEL_NATIVE": "0", **DIAG_ENV,
                    **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._ready = threading.Event()
        self._exited = threading.Event()
        self._lines_changed = threading.Condition()
        self._pumps: list[threading.Thread] = []

    def _pump(self, stream, sink: list[str], watch: bool) -> None:
        for line in stream:
            with self._lines_changed:
                sink.append(line)
                self._lines_changed.notify_all()
            if watch and line.startswith(READY_LINE):
                self._ready.set()
        if watch:
            self._exited.set()
            with self._lines_changed:
                self._lines_changed.notify_all()

    def wait_for_line(self, prefix: str, timeout: float = START_TIMEOUT_S) -> str:
        """Bounded wait for a stdout line starting with `prefix`."""
        def found():
            return next((ln for ln in self.stdout if ln.startswith(prefix)), None)
        with self._lines_changed:
            ok = self._lines_changed.wait_for(lambda: found() or self._exited.is_set(), timeout)
        line = found()
        if not line:
            raise AssertionError(f"no stdout line starting {prefix!r} (timed out: {not ok}):\n"
                                 f"{''.join(self.stdout)}\nstderr:\n{''.join(self.stderr)}")
        return line

    def wait_for_text(self, text: str, timeout: float = START_TIMEOUT_S) -> str:
        """Bounded wait for a stdout or stderr line containing `text` (a log
        line, wherever the log goes); that line."""
        def found():
            return next((ln for ln in self.stdout + self.stderr if text in ln), None)
        with self._lines_changed:  # both pumps notify; a late stderr line still counts
            line = self._lines_changed.wait_for(found, timeout)
        if not line:
            raise AssertionError(f"no output line containing {text!r} within {timeout} s:\n"
                                 f"{''.join(self.stdout)}\nstderr:\n{''.join(self.stderr)}")
        return line

    def start(self, wait_ready: bool = True) -> ServerProcess:
        LIVE.append(self)
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, text=True, env=self.env)
        self._pumps = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.stdout, True),
                             daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr, False),
                             daemon=True)]
        for pump in self._pumps:
            pump.start()
        if wait_ready:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        deadline_hit = not self._wait_either(timeout)
        if not self._ready.is_set():
            self.stop()
            why = "timed out" if deadline_hit else f"exited with {self.proc.returncode}"
            raise AssertionError(f"server {why} before '{READY_LINE}':\n"
                                 f"stdout:\n{''.join(self.stdout)}\nstderr:\n{''.join(self.stderr)}")

    def _wait_either(self, timeout: float) -> bool:
        # ready or exited, whichever first, bounded by timeout
        done = threading.Event()
        for ev in (self._ready, self._exited):
            threading.Thread(target=lambda e=ev: (e.wait(timeout), done.set()), daemon=True).start()
        return done.wait(timeout)

    def drain(self, timeout: float = 10.0) -> str:
        """Once the process exited: wait (bounded) until its stdout and
        stderr are read to EOF; everything it wrote, stdout then stderr."""
        for pump in self._pumps:
            pump.join(timeout)
            assert not pump.is_alive(), f"server output not read to EOF within {timeout} s"
        return "".join(self.stdout) + "".join(self.stderr)

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def stacks(self, timeout: float = 3.0) -> None:
        """Ask the running server for every thread's stack and every trio
        task's await stack (on its stderr; tests/diag/sitecustomize.py)."""
        for sig, mark in ((signal.SIGUSR1, "most recent call first"),   # faulthandler's
                          (signal.SIGUSR2, TASKS_HEADER)):
            if self.proc is None or self.proc.poll() is not None:
                return
            def dumps() -> int:
                return sum(mark in ln for ln in self.stderr)
            before = dumps()
            self.proc.send_signal(sig)
            with self._lines_changed:
                self._lines_changed.wait_for(lambda: dumps() > before, timeout)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from fixtures.build import ensure
    return ensure("tiny")


@pytest.fixture(scope="session")
def tiny_wide_model(tiny_model) -> Path:
    """`tiny` with 32-wide attention heads (what a quantized KV cache needs)."""
    from fixtures.build import ensure
    return ensure("tiny-wide")


def derive_draft(target: Path, out: Path, n_layers: int = 1) -> Path:
    """A draft checkpoint cut from `target`: its first n_layers layers, the
    same embeddings, head and tokenizer (so its proposals agree with the
    target's choices only sometimes).  Deterministic, offline, milliseconds."""
    import json
    import shutil

    import mlx.core as mx

    out.mkdir(parents=True, exist_ok=True)
    for f in target.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copy(f, out / f.name)
    config = json.loads((target / "config.json").read_text())
    config["num_hidden_layers"] = n_layers
    (out / "config.json").write_text(json.dumps(config, indent=2))
    weights = mx.load(str(target / "model.safetensors"))
    keep = {k: v for k, v in weights.items()
            if ".layers." not in k or int(k.split(".layers.")[1].split(".")[0]) < n_layers}
    mx.save_safetensors(str(out / "model.safetensors"), keep)
    return out


@pytest.fixture(scope="session")
def tiny_draft_model(tiny_model, tmp_path_factory) -> Path:
    return derive_draft(tiny_model, tmp_path_factory.mktemp("draft") / "tiny-draft")


@pytest.fixture(scope="session")
def tiny_vlm_model(tiny_model) -> Path:
    """tiny's language model inside a llava VLM (fixtures/vlm.py); skipped
    where the optional mlx-vlm is not installed."""
    pytest.importorskip("mlx_vlm")
    from fixtures.build import ensure
    return ensure("tiny-vlm")


@pytest.fixture(scope="session")
def tiny_pixtral_model(tiny_model) -> Path:
    """tiny's language model inside a Pixtral VLM (fixtures/pixtral.py);
    skipped where the optional mlx-vlm is not installed."""
    pytest.importorskip("mlx_vlm")
    from fixtures.build import ensure
    return ensure("tiny-pixtral")


@pytest.fixture(scope="session")
def tiny_whisper_model() -> Path:
    """A tiny random Whisper checkpoint (fixtures/whisper.py)."""
    from fixtures.build import ensure
    return ensure("tiny-whisper")


@pytest.fixture(scope="session")
def tiny_facts(tiny_model) -> dict:
    import json
    return json.loads((tiny_model / "fixture_facts.json").read_text())


@pytest.fixture(scope="session")
def start_server():
    """Factory: start_server(model, *args) -> a ready ServerProcess, stopped
    at the end of the session (or earlier by the test)."""
    started: list[ServerProcess] = []

    def _start(model, *args, env=None, wait_ready=True) -> ServerProcess:
        srv = ServerProcess(model, *args, env=env)
        started.append(srv)
        return srv.start(wait_ready=wait_ready)

    yield _start
    for srv in started:
        srv.stop()


@pytest.fixture(scope="session")
def shared_server(start_server):
    """Factory: shared_server(model, *args, env=...) -> the ready server this
    worker started for exactly that model, argument list and environment,
    started on first use and shared by every module that asks the same (so
    no test may stop it, or count on state no earlier test could leave:
    read-only checks, or requests of their own)."""
    servers: dict[tuple, ServerProcess] = {}

    def _shared(model, *args, env=None) -> ServerProcess:
        key = (str(model), args, tuple(sorted((env or {}).items())))
        if key not in servers:
            servers[key] = start_server(model, *args, env=env)
        return servers[key]

    return _shared


@pytest.fixture(scope="session")
def server(tiny_model, start_server) -> ServerProcess:
    """The shared default server: tiny model, 4 slots, 1024 tokens each."""
    return start_server(tiny_model, "-c", "4096", "-np", "4")


# The longest modules (seconds in one process, docs/testing.md), dealt to
# the workers first.  xdist deals whole files (--dist loadfile) in the order
# collected (--no-loadscope-reorder: its own order, most tests first, deals
# these few-test, long modules last, and one of them then runs alone while
# the other worker idles); the rest follow, most tests first.
LONGEST_FIRST = (
    "e2e/test_takeover.py", "e2e/test_tool_dialects.py", "e2e/test_faults.py",
    "e2e/test_router.py", "e2e/test_server_flags.py", "e2e/test_embeddings.py",
    "e2e/test_windowed_features.py", "e2e/test_webui.py", "e2e/test_replicas.py",
    "e2e/test_prompt_cache.py", "e2e/test_stream_soak.py", "e2e/test_event_loop.py",
    "e2e/test_takeover_more.py",
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items) -> None:
    """Whole modules reordered (a module's own order kept): LONGEST_FIRST,
    then the others by their number of tests, most first."""
    tests = ROOT / "tests"
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    counts: dict[Path, int] = {}
    for item in items:
        counts[item.path] = counts.get(item.path, 0) + 1

    def key(item) -> tuple:
        name = item.path.relative_to(tests).as_posix() if item.path.is_relative_to(tests) else ""
        return rank.get(name, len(rank)), -counts[item.path], str(item.path)
    items.sort(key=key)   # stable: each module's items keep their order


def watchdog_reports(lines: list[str]) -> str:
    """Every request watchdog report in a server's output, each with its
    await stack (the indented lines after it), wherever in the output it
    is: a long-lived server's report may be older than its last lines."""
    out: list[str] = []
    inside = False
    for line in lines:
        if WATCHDOG_MARK in line and "request " in line:
            inside = True
        elif not (inside and line.startswith((" ", "- ", "... "))):
            inside = False
        if inside:
            out.append(line)
    return "".join(out)


def server_sections(srv: ServerProcess) -> list[tuple[str, str]]:
    """What a failed test's report carries for one running server: its
    stacks (asked for now), last log lines and the kernel's view of its
    port; then the watchdog's reports, when it made any."""
    srv.stacks()
    tail = "".join(srv.stdout[-REPORT_LINES:] + ["--- stderr ---\n"] + srv.stderr[-STACK_LINES:]
                   + ["--- ", kernel_sockets.describe(srv.port)])
    sections = [(f"server {srv.url} ({' '.join(srv.argv[3:])})", tail)]
    stalled = watchdog_reports(srv.stdout + srv.stderr)
    if stalled:
        sections.append((f"server {srv.url}: requests the watchdog saw without progress",
                         stalled))
    return sections


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report carries, for each server still running in
    this worker, its threads' and trio tasks' stacks, its last log lines,
    the watchdog's reports of requests that stopped making progress,
    and the kernel's view of its port (connections not yet accepted, bytes
    not read): a request that timed out then shows where the server stood,
    even one the server never saw.
    Only end-to-end tests: elsewhere a server a module fixture left running
    is unrelated noise."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or "e2e" not in item.path.parts:
        return
    for srv in LIVE:
        if srv.proc is None or srv.proc.poll() is not None:
            continue
        report.sections.extend(server_sections(srv))

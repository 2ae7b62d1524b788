"""The test-only stack dumps (tests/diag/sitecustomize.py) never wedge the
server they look at: conftest sends them to every server of a worker after
any failed test, the long-lived shared server included, and bench/stress.py
and bench/soak.py send them while requests run.  The test servers' request
watchdog reports a stuck request, and a failed test's report carries it."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import struct
import subprocess
import termios
import threading

import httpx
import pytest

from tests.conftest import (
    READY_LINE,
    START_TIMEOUT_S,
    WATCHDOG_S,
    ServerProcess,
    server_sections,
    wait_until,
)

pytestmark = pytest.mark.e2e

F_SETPIPE_SZ = 1031   # linux/fcntl.h
IN_FLIGHT = 40        # requests whose tasks make the dump many pipe-fulls long


def _unread_bytes(fd: int) -> int:
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]


def _pending(pid: int, signum: int) -> bool:
    """Whether `signum` is still pending for the process as a whole."""
    with open(f"/proc/{pid}/status") as f:
        mask = next(int(line.split()[1], 16) for line in f if line.startswith("ShdPnd:"))
    return bool(mask >> (signum - 1) & 1)


def _read_to_eof(fd: int) -> None:
    while os.read(fd, 1 << 16):
        pass


def _drain(fd: int) -> None:
    while True:
        try:
            if not os.read(fd, 1 << 16):
                return
        except BlockingIOError:
            return


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc (Linux)")
def test_a_dump_asked_for_while_one_is_being_written_leaves_the_server_answering(tiny_model):
    """The first dump's write blocks on a full stderr pipe (the reader is
    slow); a second SIGUSR2 arrives meanwhile.  The handler runs on the trio
    thread inside the first one's write: had it taken the server's stderr
    lock (sys.stderr is a RedactingStream), it would wait on itself forever
    and no request would be answered again."""
    srv = ServerProcess(tiny_model, "-np", "1")
    proc = subprocess.Popen(srv.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=srv.env)
    err = proc.stderr.fileno()
    capacity = fcntl.fcntl(err, F_SETPIPE_SZ, 4096)   # a small pipe: the dump overflows it
    os.set_blocking(err, False)
    ready = threading.Event()

    def pump_stdout():
        for line in proc.stdout:
            if line.startswith(READY_LINE.encode()):
                ready.set()
    threading.Thread(target=pump_stdout, daemon=True).start()
    held: list[socket.socket] = []
    try:
        assert ready.wait(START_TIMEOUT_S), "the server never got ready"
        for _ in range(IN_FLIGHT):   # each a request task waiting for the rest of its body
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            s.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            held.append(s)
        wait_until(lambda: httpx.get(srv.url + "/slots", timeout=10).status_code, "the server "
                   "answering with the requests held", until=lambda status: status == 200)
        _drain(err)
        proc.send_signal(signal.SIGUSR2)
        wait_until(lambda: _unread_bytes(err), "the first dump filling the stderr pipe",
                   until=lambda n: n >= capacity)
        proc.send_signal(signal.SIGUSR2)
        wait_until(lambda: _pending(proc.pid, signal.SIGUSR2), "the second SIGUSR2 delivered",
                   until=lambda pending: not pending)
        os.set_blocking(err, True)
        threading.Thread(target=_read_to_eof, args=(err,), daemon=True).start()
        # the first dump finishes once read; the server answers again
        wait_until(lambda: _health(srv.url), "the server answering after the dumps",
                   until=lambda status: status == 200)
    finally:
        for s in held:
            s.close()
        proc.kill()
        proc.wait(10)


def _health(url: str) -> int | str:
    try:
        return httpx.get(url + "/health", timeout=5).status_code
    except httpx.HTTPError as exc:
        return type(exc).__name__


def test_a_stuck_request_is_reported_by_the_test_servers_watchdog_into_the_test_report(
        tiny_model, start_server):
    """Test servers run the watchdog with a short bound (conftest); a
    request stuck past it is logged with its task's await stack, and the
    report of a failed test carries that log whole, however long ago the
    long-lived server logged it.  Here the bound is shortened further and
    the request is one whose body never completes."""
    assert ServerProcess(tiny_model).env["MLXCEL_REQUEST_WATCHDOG_S"] == str(WATCHDOG_S)
    srv = start_server(tiny_model, "-np", "1", env={"MLXCEL_REQUEST_WATCHDOG_S": "0.5"})
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        srv.wait_for_text("request POST /completion: no progress for", timeout=30)
        srv.stdout.extend(["a later line\n"] * 1000)   # the report is far from the tail now
        titled = dict(server_sections(srv))
    (report,) = [text for title, text in titled.items() if "without progress" in title]
    assert report.count("no progress for") == 1, report
    assert "in read_json_body" in report, report   # where it waits: its body
    assert "a later line" not in report

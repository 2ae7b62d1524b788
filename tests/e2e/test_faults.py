"""Faults beyond a client's, against real processes: a full disk under the
slot files and under the log file (a small ext4 on a loop device, or a
tmpfs where no loop device can be made: tests/e2e/small_disk.py; they skip
where mounting needs a privilege this process lacks), and a session
store that stops answering mid-stream (a SIGSTOPped redis-server / valkey-
server: the connection stays open, nothing comes back), a slow store link
and one that stops forwarding (a TCP proxy between two replicas and the
store: tests/e2e/tcp_proxy.py), and a stopped router child.  The store's
loss and return (the process gone, then back on its port) is tested in
test_replicas.py."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
import warnings

import httpx
import pytest

from tests.conftest import wait_until
from tests.store_server import StoreServer

from . import small_disk as disks
from .small_disk import fill
from .sse import post
from .tcp_proxy import TcpProxy
from .test_stream_resume import TERMINAL, frames, get_cut, post_cut

pytestmark = pytest.mark.e2e

GREEDY = {"temperature": 0, "ignore_eos": True}
PROMPT = "The engine builds a long answer"
BOUND_S = 30.0


@pytest.fixture
def small_disk(tmp_path):
    """A small filesystem at a fresh directory: ext4 on a loop device where
    this process may make one, else a tmpfs (said in the output: a warning);
    unmounted (and the loop device detached) at the end."""
    with contextlib.ExitStack() as stack:
        try:
            disk = stack.enter_context(disks.small_disk(tmp_path))
        except OSError as exc:
            pytest.skip(f"no small filesystem to fill here: {exc}; "
                        "the full-disk tests need root")
        print(f"full-disk test on {disk.kind}")
        if disk.fallback:
            warnings.warn(f"full-disk test on {disk.kind}, not a loop-device ext4: "
                          f"{disk.fallback}", stacklevel=1)
        yield disk.path


def test_a_full_disk_under_slot_files_is_a_clear_error_and_serving_goes_on(
        tiny_model, start_server, small_disk):
    srv = start_server(tiny_model, "-c", "2048", "-np", "1", "--slot-save-path", str(small_disk))
    try:
        assert post(srv.url, {"prompt": PROMPT, "n_predict": 8, **GREEDY}).status_code == 200
        fill(small_disk)
        r = post(srv.url, {"filename": "full.bin"}, path="/slots/0?action=save")
        assert r.status_code == 500, r.text
        assert r.json()["error"]["message"] == "Unable to save slot"   # upstream's wording
        srv.wait_for_text("slot 0: saving full.bin failed: No space left on device", 10)
        assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]  # no partial file
        assert post(srv.url, {"prompt": PROMPT, "n_predict": 4, **GREEDY}).status_code == 200
        (small_disk / "filler").unlink()                  # space again: saving works
        r = post(srv.url, {"filename": "full.bin"}, path="/slots/0?action=save")
        assert r.status_code == 200 and r.json()["n_saved"] > 0, r.text
    finally:
        srv.stop()


def test_a_full_disk_under_the_log_file_is_said_once_and_serving_goes_on(
        tiny_model, start_server, small_disk):
    log_file = small_disk / "server.log"
    srv = start_server(tiny_model, "-c", "2048", "-np", "1", "--log-file", str(log_file))
    try:
        fill(small_disk)
        mark = f"error: --log-file {log_file}: cannot write (No space left on device)"

        def refused() -> bool:
            # each request logs a line; the log's last page takes a few before it is full
            assert post(srv.url, {"prompt": PROMPT, "n_predict": 4, **GREEDY}).status_code == 200
            return any(mark in ln for ln in srv.stderr)
        wait_until(refused, "the full log file said on stderr", BOUND_S, pause=0)
        for _ in range(5):   # more refused lines: said once
            assert post(srv.url, {"prompt": PROMPT, "n_predict": 4, **GREEDY}).status_code == 200
        said = srv.wait_for_text(mark, 10)
        assert "the server goes on serving" in said
        assert sum("cannot write" in ln for ln in srv.stderr) == 1, srv.stderr
        assert not any("Logging error" in ln for ln in srv.stderr), srv.stderr
        (small_disk / "filler").unlink()
        assert post(srv.url, {"prompt": PROMPT, "n_predict": 4, **GREEDY}).status_code == 200
        srv.wait_for_text(f"warning: --log-file {log_file}: writable again", 10)
        assert httpx.get(srv.url + "/health", timeout=10).status_code == 200
    finally:
        srv.stop()


@pytest.fixture
def store():
    server = StoreServer().start()
    yield server
    if server.proc is not None and server.proc.poll() is None:
        server.proc.send_signal(signal.SIGCONT)
    server.stop()


def test_a_store_that_stops_answering_mid_stream(tiny_model, start_server, store):
    srv = start_server(tiny_model, "-c", "4096", "-np", "2", "--session-store", store.url)
    try:
        body = {"prompt": PROMPT, "n_predict": 24, **GREEDY}
        # long enough that most of its bytes are written after the store stopped
        with httpx.Client(timeout=60) as c, c.stream(
                "POST", srv.url + "/completion", json={**body, "n_predict": 1000,
                                                      "stream": True},
                headers={"X-Conversation-Id": f"stop-{uuid.uuid4()}"}) as r:
            it = r.iter_raw()
            got = next(it)
            store.proc.send_signal(signal.SIGSTOP)            # half-open: nothing answers
            for chunk in it:
                got += chunk
        # the session's client still gets every byte (once the store's writes time out)
        assert b'"stop":true' in got
        # a request without X-Conversation-Id never waits on the store
        t = time.monotonic()
        assert post(srv.url, body).status_code == 200
        assert time.monotonic() - t < BOUND_S / 2
        # a new resumable session is refused, clearly, within a bound
        t = time.monotonic()
        r = post(srv.url, {**body, "stream": True},
                 headers={"X-Conversation-Id": f"refused-{uuid.uuid4()}"})
        assert time.monotonic() - t < BOUND_S
        assert r.status_code == 503, r.text
        assert "session store" in r.json()["error"]["message"]
        store.proc.send_signal(signal.SIGCONT)               # answering again: picked up

        def resumable() -> int:
            return post(srv.url, {**body, "n_predict": 2, "stream": True},
                        headers={"X-Conversation-Id": f"back-{uuid.uuid4()}"}).status_code
        wait_until(resumable, "a resumable session accepted once the store answers", BOUND_S,
                   until=lambda status: status == 200, pause=0.2)
        assert srv.proc.poll() is None
    finally:
        srv.stop()


SLOW_S = 0.15   # added to every chunk the store link carries, each way


def test_a_slow_store_link_then_one_that_stops_forwarding(tiny_model, start_server, store):
    """Two replicas reach the store through a proxy that delays every chunk:
    a session started on A still resumes through B byte for byte, and a
    request without X-Conversation-Id is not slowed by the store.  Then the
    proxy stops forwarding (half-open: the store is alive, no byte gets
    through): plain requests still answer, a new resumable stream is
    refused clearly within a bound, and once it forwards again resumable
    streams are accepted without a restart."""
    proxy = TcpProxy(store.port, delay_s=SLOW_S)
    args = ("-c", "4096", "-np", "2", "--session-store", proxy.url())
    a = start_server(tiny_model, *args)
    b = start_server(tiny_model, *args)
    try:
        path, body = "/completion", {"prompt": PROMPT, "n_predict": 32, **GREEDY, "stream": True}
        plain, ended = post_cut(a.url, path, body, None, 1 << 30)
        assert ended and TERMINAL[path] in plain
        conv = f"slow-{uuid.uuid4()}"
        t = time.monotonic()
        first, ended = post_cut(a.url, path, body, conv, 120)
        assert not ended
        rest, ended = get_cut(b.url, conv, len(first))      # read from the store, through B
        assert ended
        assert time.monotonic() - t < BOUND_S
        assert frames(first + rest) == frames(plain)
        assert get_cut(b.url, conv, 0)[0] == first + rest
        t = time.monotonic()
        assert post(a.url, {**body, "stream": False}).status_code == 200
        assert time.monotonic() - t < BOUND_S / 2

        proxy.stall()
        t = time.monotonic()
        assert post(b.url, {**body, "stream": False}).status_code == 200
        assert time.monotonic() - t < BOUND_S / 2
        t = time.monotonic()
        r = post(b.url, body, headers={"X-Conversation-Id": f"stalled-{uuid.uuid4()}"})
        assert time.monotonic() - t < BOUND_S
        assert r.status_code == 503, r.text
        assert "session store" in r.json()["error"]["message"]
        proxy.resume()

        def resumable() -> int:
            return post(b.url, {**body, "n_predict": 2},
                        headers={"X-Conversation-Id": f"back-{uuid.uuid4()}"}).status_code
        wait_until(resumable, "a resumable session accepted once the link forwards again",
                   BOUND_S * 2, until=lambda status: status == 200, pause=0.2)
        assert a.proc.poll() is None and b.proc.poll() is None
    finally:
        a.stop()
        b.stop()
        proxy.close()


def test_router_restarts_a_stopped_child_and_leaves_the_others_alone(tmp_path, tiny_model):
    import shutil

    from .test_router import BODY, Router

    root = tmp_path / "models"
    root.mkdir()
    for name in ("alpha", "beta"):
        shutil.copytree(tiny_model, root / name)
    router = Router(root, "-np", "1", "-c", "1024", "--no-warmup",
                    env={"MLXCEL_INTERNAL_ROUTER_HEALTH_S": "0.5"}).start()
    try:
        for name in ("alpha", "beta"):
            assert post(router.url, {**BODY, "model": name}).status_code == 200
        stopped = router.child_pid("alpha")
        os.kill(stopped, signal.SIGSTOP)
        try:
            router.wait_for_text("alpha: its server failed 3 health checks in a row", BOUND_S)
            # meanwhile and after, the other model is unaffected
            assert post(router.url, {**BODY, "model": "beta"}).status_code == 200
            wait_until(router.statuses, "alpha loaded again", BOUND_S,
                       until=lambda st: st.get("alpha") == "loaded", pause=0.2)
            assert router.child_pid("alpha") != stopped
            assert post(router.url, {**BODY, "model": "alpha"}).status_code == 200
            assert router.statuses()["beta"] == "loaded"
        finally:
            try:
                os.kill(stopped, signal.SIGKILL)
            except ProcessLookupError:
                pass
    finally:
        router.stop()

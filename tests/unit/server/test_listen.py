"""server/http/listen.py: socket binding rules, the bounded write, the read
timeout that stops once a request has arrived, and the startup check of the
hypercorn internals all that builds on (server/http/hypercorn_internals.py)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import trio
import trio.testing
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import RawData

from mlxcel_trio.server.http import hypercorn_internals, listen

from .._checkpoint import fake_checkpoint

ROOT = Path(__file__).resolve().parents[3]


def test_port_zero_binds_an_ephemeral_port_and_names_it():
    sock = listen.bind("127.0.0.1", 0, reuse_port=False)
    try:
        port = sock.getsockname()[1]
        assert port != 0
        assert listen.listening_address(sock, tls=False) == f"http://127.0.0.1:{port}"
        assert listen.listening_address(sock, tls=True) == f"https://127.0.0.1:{port}"
    finally:
        sock.close()


def test_reuse_port_lets_two_sockets_share_a_port():
    first = listen.bind("127.0.0.1", 0, reuse_port=True)
    port = first.getsockname()[1]
    try:
        second = listen.bind("127.0.0.1", port, reuse_port=True)
        second.close()
        with pytest.raises(listen.BindError, match=f"cannot listen on 127.0.0.1:{port}"):
            listen.bind("127.0.0.1", port, reuse_port=False)
    finally:
        first.close()


def test_a_host_ending_in_sock_is_a_unix_socket(tmp_path):
    path = str(tmp_path / "srv.sock")
    sock = listen.bind(path, 8080, reuse_port=False)
    assert sock.family == socket.AF_UNIX
    assert listen.listening_address(sock, tls=False) == f"unix://{path}"
    sock.close()
    again = listen.bind(path, 8080, reuse_port=False)  # the stale socket file is replaced
    again.close()


class _Stuck:
    """A stream whose peer never reads."""

    async def send_all(self, data):
        await trio.sleep_forever()


class _Protocol:
    def __init__(self):
        self.events = []

    async def handle(self, event):
        self.events.append(type(event).__name__)


async def test_a_write_the_client_never_reads_is_bounded(autojump_clock):
    server = object.__new__(listen.TimedTCPServer)
    server.write_timeout = 30
    server.send_lock = trio.Lock()
    server.stream = _Stuck()
    server.protocol = _Protocol()
    start = trio.current_time()
    await server.protocol_send(RawData(b"x" * 10))
    assert server.protocol.events == ["Closed"]
    assert trio.current_time() - start == pytest.approx(30)


# -- the read timeout, through listen.serve on a real socket ---------------------

READ_TIMEOUT = 2.0


@pytest.fixture
def quiet_clock() -> trio.testing.MockClock:
    """Virtual time that jumps once every task has been blocked for 50 ms of
    real time: bytes in flight on the loopback are never taken for silence
    (autojump_clock jumps at once, before the kernel may have delivered them)."""
    return trio.testing.MockClock(autojump_threshold=0.05)


async def _lifespan(receive, send) -> None:
    """An ASGI lifespan that starts at once and stops when told."""
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})


def _streaming_app(chunks: int, pause: float):
    """An ASGI app: read the whole body, then stream `chunks` chunks `pause`
    seconds apart (virtual seconds, under quiet_clock); a disconnect
    cancels the response, as quart-trio does."""
    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        while (message := await receive())["type"] == "http.request" and message["more_body"]:
            pass
        if message["type"] == "http.disconnect":
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for i in range(chunks):
                await trio.sleep(pause)
                await send({"type": "http.response.body", "body": b"chunk %d\n" % i,
                            "more_body": True})
            await send({"type": "http.response.body", "body": b"end\n"})
            nursery.cancel_scope.cancel()
    return app


async def _cancel_on_disconnect(receive, scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def _serving(nursery, app, grace: float | None = None) -> tuple[int, trio.Event]:
    sock = listen.bind("127.0.0.1", 0, reuse_port=False)
    port = sock.getsockname()[1]
    shutdown = trio.Event()
    config = HypercornConfig()
    if grace is not None:
        config.graceful_timeout = grace
    await nursery.start(lambda task_status: listen.serve(
        app, config, [sock], write_timeout=READ_TIMEOUT, read_timeout=READ_TIMEOUT,
        shutdown_trigger=shutdown.wait, task_status=task_status))
    return port, shutdown


async def _receive_all(stream) -> bytes:
    """Everything the server sends until it closes the connection."""
    reply = b""
    while data := await stream.receive_some(65536):
        reply += data
    return reply


async def test_a_response_streaming_longer_than_the_read_timeout_completes(quiet_clock):
    async with trio.open_nursery() as nursery:
        port, shutdown = await _serving(nursery, _streaming_app(chunks=4, pause=READ_TIMEOUT))
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                              b"Connection: close\r\n\r\n{}")
        start = trio.current_time()
        reply = await _receive_all(stream)  # the client sends nothing more meanwhile
        elapsed = trio.current_time() - start
        await stream.aclose()
        shutdown.set()
    assert reply.startswith(b"HTTP/1.1 200"), reply
    body = reply.split(b"\r\n\r\n", 1)[1]
    for i in range(4):
        assert b"chunk %d\n" % i in body, reply
    assert body.endswith(b"end\n\r\n0\r\n\r\n"), reply  # the last chunk, then the end
    assert elapsed >= 4 * READ_TIMEOUT  # the stream really outlived the read timeout


async def test_a_request_body_that_stalls_is_cut_by_the_read_timeout(quiet_clock):
    async with trio.open_nursery() as nursery:
        port, shutdown = await _serving(nursery, _streaming_app(chunks=1, pause=0))
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{}")
        start = trio.current_time()
        reply = await _receive_all(stream)
        elapsed = trio.current_time() - start
        await stream.aclose()
        shutdown.set()
    assert reply == b""  # closed without an answer: the app saw a disconnect
    assert elapsed == pytest.approx(READ_TIMEOUT)


async def test_an_http2_stream_is_not_cut_by_the_read_timeout(quiet_clock):
    """hypercorn switches to HTTP/2 on prior knowledge (or an h2c upgrade)
    whatever the ALPN list says; such a connection has no HTTP/1.1 turn to
    follow, so no read timeout applies to it."""
    from h2.config import H2Configuration
    from h2.connection import H2Connection
    from h2.events import DataReceived, StreamEnded

    async with trio.open_nursery() as nursery:
        port, shutdown = await _serving(nursery, _streaming_app(chunks=4, pause=READ_TIMEOUT))
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        client = H2Connection(H2Configuration(client_side=True))
        client.initiate_connection()
        client.send_headers(1, [(":method", "GET"), (":path", "/"), (":scheme", "http"),
                                (":authority", "x")], end_stream=True)
        body, ended, last_sent = b"", False, trio.current_time()
        while not ended:
            if outgoing := client.data_to_send():  # the handshake only: no window updates
                await stream.send_all(outgoing)
                last_sent = trio.current_time()
            data = await stream.receive_some(65536)
            assert data, f"the server closed the HTTP/2 connection; body so far {body!r}"
            for event in client.receive_data(data):
                body += event.data if isinstance(event, DataReceived) else b""
                ended = ended or isinstance(event, StreamEnded)
        silent = trio.current_time() - last_sent
        await stream.aclose()
        shutdown.set()
    assert body == b"chunk 0\nchunk 1\nchunk 2\nchunk 3\nend\n"
    assert silent >= 3 * READ_TIMEOUT  # the client really sent nothing for that long


# -- the startup check of hypercorn's internals --------------------------------

def test_the_installed_hypercorn_has_every_internal_listen_relies_on():
    assert hypercorn_internals.missing() == []
    hypercorn_internals.check()


def test_the_pin_is_the_supported_range_and_the_installed_version_is_in_it():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (pin,) = [d for d in project["dependencies"] if d.startswith("hypercorn")]
    assert pin == "hypercorn" + hypercorn_internals.SUPPORTED
    bounds = re.fullmatch(r">=(\d+)\.(\d+),<(\d+)\.(\d+)", hypercorn_internals.SUPPORTED)
    low_major, low_minor, high_major, high_minor = (int(x) for x in bounds.groups())
    installed = tuple(int(x) for x in hypercorn_internals.installed_version().split(".")[:2])
    assert (low_major, low_minor) <= installed < (high_major, high_minor)


def _run_without_read_data(self):  # a TCPServer.run that no longer calls our override
    return self.stream


class _H11Renamed:
    """H11Protocol with its h11 connection moved to another attribute."""

    def __init__(self, *args):
        self.h11_connection = object()


@pytest.mark.parametrize(("where", "name", "value", "reported"), [
    ("hypercorn.trio.tcp_server.TCPServer", "_read_data", None,
     "hypercorn.trio.tcp_server.TCPServer._read_data is missing"),
    ("hypercorn.trio.tcp_server", "MAX_RECV", None,
     "hypercorn.trio.tcp_server.MAX_RECV is missing"),
    ("hypercorn.trio.tcp_server.TCPServer", "run", _run_without_read_data,
     "hypercorn.trio.tcp_server.TCPServer.run no longer uses ProtocolWrapper"),
    ("hypercorn.protocol", "H11Protocol", _H11Renamed,
     ("ProtocolWrapper(...).protocol.connection cannot be followed for HTTP/1.1 "
      "(AttributeError:")),
], ids=["override-target", "constant", "call-site", "attribute-path"])
def test_a_missing_internal_refuses_with_the_version_and_the_range(
        monkeypatch, where, name, value, reported):
    if value is None:
        monkeypatch.delattr(f"{where}.{name}")
    else:
        monkeypatch.setattr(f"{where}.{name}", value)
    with pytest.raises(hypercorn_internals.HypercornUnsupported) as refused:
        hypercorn_internals.check()
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith(f"hypercorn {hypercorn_internals.installed_version()} is not "
                           f"supported: {reported}")
    assert line.endswith(f"mlxcel-trio needs hypercorn{hypercorn_internals.SUPPORTED}")


_BROKEN_HYPERCORN = """
import sys
import hypercorn.trio.tcp_server
del hypercorn.trio.tcp_server.TCPServer._read_data
from mlxcel_trio.entry import server_main
sys.exit(server_main(sys.argv[1:]))
"""


def test_the_server_refuses_to_start_before_the_model_loads(tmp_path):
    """The whole path: one `error:` line on stderr, exit 1, nothing bound and
    no model load attempted (the fake checkpoint would fail to load)."""
    checkpoint = fake_checkpoint(tmp_path / "ckpt")
    proc = subprocess.run(
        [sys.executable, "-c", _BROKEN_HYPERCORN, "-m", str(checkpoint), "--port", "0"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("LLAMA_")})
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [(
        f"error: hypercorn {hypercorn_internals.installed_version()} is not supported: "
        "hypercorn.trio.tcp_server.TCPServer._read_data is missing; "
        f"mlxcel-trio needs hypercorn{hypercorn_internals.SUPPORTED}")]


# -- writes on a real socket: the non-blocking first write and what follows it ----------

def _bulk_app(chunks: int, size: int):
    """Stream `chunks` chunks of `size` bytes, each filled with its index's
    letter, so any reordering or loss shows in the body."""
    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(chunks * size).encode())]})
        for i in range(chunks):
            await send({"type": "http.response.body", "body": bytes([65 + i % 26]) * size,
                        "more_body": i < chunks - 1})
    return app


async def test_writes_larger_than_the_socket_buffer_arrive_whole_and_in_order(quiet_clock):
    chunks, size = 12, 1 << 20  # far more than a loopback socket buffers
    async with trio.open_nursery() as nursery:
        port, shutdown = await _serving(nursery, _bulk_app(chunks, size))
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await trio.sleep(READ_TIMEOUT / 2)  # the server fills the socket and waits
        reply = await _receive_all(stream)
        await stream.aclose()
        shutdown.set()
    body = reply.split(b"\r\n\r\n", 1)[1]
    assert body == b"".join(bytes([65 + i % 26]) * size for i in range(chunks))


async def test_a_client_that_never_reads_is_cut_by_the_write_timeout(quiet_clock):
    chunks, size = 12, 1 << 20
    async with trio.open_nursery() as nursery:
        port, shutdown = await _serving(nursery, _bulk_app(chunks, size))
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        start = trio.current_time()
        await trio.sleep(10 * READ_TIMEOUT)  # never reading meanwhile
        reply = await _receive_all(stream)
        await stream.aclose()
        shutdown.set()
    body = reply.split(b"\r\n\r\n", 1)[1]
    assert 0 < len(body) < chunks * size  # what the buffers held, then the close
    assert trio.current_time() - start >= 10 * READ_TIMEOUT


def _answer_under_a_pending_cancel():
    """An ASGI app whose first response is sent whole while a cancel of its
    task is pending (nothing in the sends checkpoints before hypercorn
    recycles the connection), the next normally; each answers "ok"."""
    served = []

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        await receive()
        with trio.CancelScope() as cs:
            if not served:
                cs.cancel()
            served.append(scope["path"])
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})
    return app


async def test_a_response_sent_under_a_pending_cancel_leaves_the_connection_answering(
        quiet_clock):
    """The kept-alive connection's next request is answered: the response's
    last send (where hypercorn readies the connection for the next request)
    is shielded by the request wrapper (http/app_shell.PerRequest); without
    that the connection is left never answering again."""
    from mlxcel_trio.server.http.app_shell import PerRequest

    async with trio.open_nursery() as nursery:
        port, shutdown = await _serving(nursery, PerRequest(_answer_under_a_pending_cancel()))
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        replies = []
        for path in (b"/first", b"/next"):
            await stream.send_all(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path)
            reply = b""
            with trio.move_on_after(4 * READ_TIMEOUT):
                while not reply.endswith(b"\r\n\r\nok"):
                    reply += await stream.receive_some(65536)
            replies.append(reply)
        await stream.aclose()
        shutdown.set()
    assert replies[0].startswith(b"HTTP/1.1 200"), replies
    assert replies[1].startswith(b"HTTP/1.1 200"), f"the next request got no answer: {replies}"


def _never_answering(arrived: trio.Event):
    """An ASGI app that reads the request, says so, and never answers."""
    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        await receive()
        arrived.set()
        await trio.sleep_forever()
    return app


async def test_a_request_cancelled_from_outside_ends_its_connection(quiet_clock):
    """The one cancel of a request from outside hypercorn's own scopes: the
    connection's scope (here the shutdown's grace running out; a failed task
    of the connection does the same).  hypercorn's closing send then runs
    under that cancel and may stop before readying the connection for the
    next request, here one already pipelined behind it; the connection is
    closed all the same, so its client sees the end, never a silence."""
    from mlxcel_trio.server.http.app_shell import PerRequest

    arrived = trio.Event()
    async with trio.open_nursery() as nursery:
        port, shutdown = await _serving(nursery, PerRequest(_never_answering(arrived)),
                                        grace=READ_TIMEOUT)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"POST /first HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
                              b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
        await arrived.wait()
        shutdown.set()
        start = trio.current_time()
        reply = b""
        with trio.move_on_after(4 * READ_TIMEOUT) as silent:
            try:
                reply = await _receive_all(stream)
            except trio.BrokenResourceError:  # a reset is an end too
                pass
        elapsed = trio.current_time() - start
        await stream.aclose()
    assert not silent.cancelled_caught, f"the connection stayed open without an answer: {reply}"
    assert elapsed == pytest.approx(READ_TIMEOUT, abs=0.5)
    assert reply == b"" or reply.startswith(b"HTTP/1.1 500"), reply

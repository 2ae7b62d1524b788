"""server/http/listen.py: socket binding rules and the bounded write."""

from __future__ import annotations

import socket

import pytest
import trio

from mlxcel_trio.server.http import listen


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
    server = object.__new__(listen._TimedTCPServer)
    server.write_timeout = 30
    server.send_lock = trio.Lock()
    server.stream = _Stuck()
    server.protocol = _Protocol()
    start = trio.current_time()
    await server.protocol_send(listen.RawData(b"x" * 10))
    assert server.protocol.events == ["Closed"]
    assert trio.current_time() - start == pytest.approx(30)

"""tests/diag/kernel_sockets.py: a failed test's report tells a connection the
server never accepted, and bytes it never read, from one it answered."""

from __future__ import annotations

import os
import socket

import pytest

from tests.conftest import wait_until
from tests.diag import kernel_sockets as sockets

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="Linux /proc")


def test_connections_not_accepted_and_bytes_not_read_are_told():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        first = socket.create_connection(("127.0.0.1", port))
        second = socket.create_connection(("127.0.0.1", port))
        try:
            report = wait_until(lambda: sockets.describe(port), "two connections queued",
                                until=lambda text: "2 connections not yet accepted" in text)
            assert "connections: 2 ESTABLISHED" in report, report
            accepted, _ = server.accept()
            with accepted:
                first.sendall(b"POST /completion")   # one of the two: the kernel holds it
                report = wait_until(lambda: sockets.describe(port), "16 bytes held",
                                    until=lambda text: "16 bytes unread" in text)
                assert "1 connections not yet accepted" in report, report
                assert report.count("bytes unread") == 1, report
        finally:
            first.close()
            second.close()


def test_a_port_nothing_uses_says_so():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert sockets.describe(port) == f"kernel sockets on port {port}:\n  connections: none\n"

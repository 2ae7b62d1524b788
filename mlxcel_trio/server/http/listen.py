"""Listening sockets and the HTTP serve loop.

Sockets are bound here rather than by hypercorn so that upstream's rules
hold exactly: a --host ending in ".sock" is a Unix domain socket path, --port
0 binds an ephemeral port (and the lifecycle line shows the real one),
SO_REUSEADDR always and SO_REUSEPORT with --reuse-port.

`serve` is hypercorn's trio worker loop (lifespan, then listeners, graceful
shutdown by a deadline on the connection nursery) with one change: every
write to a client is bounded by --timeout.  hypercorn shields each send_all
and has no write timeout, so a client that stops reading a response would
hold its request task (and, for a stream, its slot) forever; here the write
fails after `write_timeout` seconds, the connection closes, and the request
is cancelled like any disconnect.  Reading is bounded while the server
waits for the client: the request head by keep_alive_timeout (5 s as
upstream's keep-alive, from the connection's start or the last response's
end until a complete head arrives), each read of the body by `read_timeout` (--timeout) and the whole body by
Quart's BODY_TIMEOUT (--timeout).  hypercorn's own per-read timeout is not
used: it also runs while a response streams and the client, rightly, sends
nothing, so it would cut any stream longer than --timeout; ours stops once
the request has fully arrived, as upstream's (which reads, then writes).
The keep-alive is this read's deadline too, not hypercorn's idle timer:
that timer is restarted from the request's own task and dies with Quart's
request nursery, which left a kept-alive connection open until --timeout.
On shutdown a connection waiting for its next request closes at once, so an
idle client does not hold the exit for the grace; requests in flight get
the grace (server/drain.py).

Whether it has arrived is h11's `their_state`, read at
`self.protocol.protocol.connection`: hypercorn internals, like `_read_data`
itself, that hypercorn_internals.check() verifies before the server starts
(the runner refuses to start without them).  A connection that hypercorn
switched away from HTTP/1.1 (an h2c upgrade, HTTP/2 prior knowledge, a
WebSocket) has no request/response turn to follow: its reads get no timeout,
never a guess; Quart's BODY_TIMEOUT still bounds each request body there.
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Awaitable, Callable
from functools import partial
from math import inf

import h11
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, RawData, Updated
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import ShutdownError, raise_shutdown, wrap_app

BACKLOG = 1024


class BindError(Exception):
    """The socket could not be bound; str() is the one-line reason."""


def is_unix(host: str) -> bool:
    return host.endswith(".sock")


def bind(host: str, port: int, reuse_port: bool) -> socket.socket:
    """A listening, non-blocking socket for --host/--port."""
    try:
        if is_unix(host):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                if stat.S_ISSOCK(os.lstat(host).st_mode):
                    os.unlink(host)  # a stale socket from an earlier run
            except FileNotFoundError:
                pass
            sock.bind(host)
        else:
            family, kind, proto, _, addr = socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
            sock = socket.socket(family, kind, proto)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.bind(addr)
        sock.listen(BACKLOG)
    except OSError as exc:
        where = host if is_unix(host) else f"{host}:{port}"
        raise BindError(f"cannot listen on {where}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock


def listening_address(sock: socket.socket, tls: bool) -> str:
    """upstream's listening address: unix://PATH or http(s)://host:port."""
    if sock.family == socket.AF_UNIX:
        return f"unix://{sock.getsockname()}"
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"{'https' if tls else 'http'}://{host}:{port}"


class TimedTCPServer(TCPServer):
    """hypercorn's connection handler with a bounded write, and a read
    timeout that applies only while the request is still arriving."""

    write_timeout: float | None = None
    read_timeout: float | None = None
    live: set  # the server's open connections (serve() gives each server class its own)
    _idle_until: float | None = None  # between requests: when the keep-alive ends
    _reading: trio.CancelScope | None = None  # the latest read's scope

    def _h11_connection(self) -> h11.Connection | None:
        """The connection's h11 state machine; None once hypercorn switched
        the connection to HTTP/2 or a WebSocket."""
        connection = self.protocol.protocol.connection
        return connection if isinstance(connection, h11.Connection) else None

    def _awaiting_client(self) -> bool:
        """True while an HTTP/1.1 request is still arriving (or the next one
        is awaited); False once it fully arrived and its response may be
        streaming, when the client rightly sends nothing."""
        connection = self._h11_connection()
        return connection is not None and connection.their_state not in (
            h11.DONE, h11.MUST_CLOSE, h11.CLOSED)

    async def _read_data(self) -> None:
        self._idle_until = trio.current_time() + self.config.keep_alive_timeout
        self.live.add(self)
        try:
            while True:
                with trio.CancelScope(deadline=self._read_deadline()) as self._reading:
                    try:
                        data = await self.stream.receive_some(MAX_RECV)
                    except (trio.ClosedResourceError, trio.BrokenResourceError):
                        break
                if self._reading.cancelled_caught:  # a deadline passed, or shutdown
                    break
                await self.protocol.handle(RawData(bytes(data)))
                if data == b"":
                    break
        finally:
            self.live.discard(self)
        await self.protocol.handle(Closed())

    def _read_deadline(self) -> float:
        """Between requests: the keep-alive's end (now, once the server is
        shutting down); while a request arrives: --timeout per read; while
        its response is written: none."""
        if self._idle_until is not None:
            return -inf if self.context.terminated.is_set() else self._idle_until
        if self.read_timeout and self._awaiting_client():
            return trio.current_time() + self.read_timeout
        return inf

    async def _idle_timeout(self) -> None:
        """hypercorn's keep-alive timer, replaced by the read deadline above:
        it is restarted from the request's own task, so it was cancelled
        with Quart's request nursery, and an idle connection stayed open
        until --timeout (and held a shutdown for its whole grace)."""

    def close_if_idle(self) -> None:
        """At shutdown: a connection waiting for its next request closes at
        once; one with a request in flight finishes it (within the grace)
        and then closes (hypercorn recycles no connection once terminated)."""
        if self._idle_until is not None and self._reading is not None:
            self._reading.cancel()

    async def protocol_send(self, event) -> None:
        if isinstance(event, Updated):  # the keep-alive starts, or a request arrived
            self._idle_until = (trio.current_time() + self.config.keep_alive_timeout
                                if event.idle else None)
            if event.idle and self._reading is not None:  # the read under way waits for it
                self._reading.deadline = self._idle_until
            return
        if not isinstance(event, RawData) or self.write_timeout is None:
            return await super().protocol_send(event)
        if self._fast_path():
            # holding the lock from the first byte on: a write that only
            # partly fits finishes before any other send starts
            try:
                sent = self._write_now(event.data)
                ok = sent is not None and (sent == len(event.data) or await self._send_all(
                    memoryview(event.data)[sent:]))
            finally:
                self.send_lock.release()
        else:
            async with self.send_lock:
                ok = await self._send_all(event.data)
        if not ok:
            await self.protocol.handle(Closed())
            return
        if self._must_close():
            # a complete "Connection: close" response (a 408/413 that left the
            # body unread): hypercorn would wait for the rest of that body
            await super().protocol_send(Closed())

    def _fast_path(self) -> bool:
        """A plain TCP or Unix socket and no send under way: then the send
        lock is taken here, without waiting.  An SSE frame is small and the
        socket usually has room, so one non-blocking write spares each frame
        send_all's cancel scopes and its two scheduler round trips, which at
        many streams on few cores were a fifth of the event loop's time."""
        if not isinstance(self.stream, trio.SocketStream):
            return False
        try:
            self.send_lock.acquire_nowait()
        except trio.WouldBlock:
            return False
        return True

    def _write_now(self, data: bytes) -> int | None:
        """Bytes one non-blocking write sent (0 when the socket is full);
        None when the peer is gone."""
        try:
            return os.write(self.stream.socket.fileno(), data)
        except BlockingIOError:
            return 0
        except OSError:
            return None

    async def _send_all(self, data) -> bool:
        """The bounded write (the send lock held); False when it failed."""
        try:
            with trio.CancelScope(shield=True):
                with trio.fail_after(self.write_timeout):
                    await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
            return False
        return True

    def _must_close(self) -> bool:
        connection = self._h11_connection()
        return connection is not None and connection.our_state is h11.MUST_CLOSE


async def serve(app, config: HypercornConfig, sockets: list[socket.socket], *,
                write_timeout: float | None, read_timeout: float | None,
                shutdown_trigger: Callable[[], Awaitable[None]],
                task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve `app` on already-listening `sockets` until `shutdown_trigger`
    returns; in-flight requests get config.graceful_timeout."""
    wrapped = wrap_app(app, config.wsgi_max_body_size, "asgi")
    state: dict = {}
    lifespan = Lifespan(wrapped, config, state)
    context = WorkerContext(None)
    live: set[TimedTCPServer] = set()
    server_cls = type("_Server", (TimedTCPServer,), {"write_timeout": write_timeout,
                                                      "read_timeout": read_timeout,
                                                      "live": live})
    ssl_context = config.create_ssl_context()
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as connections:
            listeners = []
            for sock in sockets:
                listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
                if ssl_context is not None:
                    listener = trio.SSLListener(listener, ssl_context, https_compatible=True)
                listeners.append(listener)
            task_status.started()
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(raise_shutdown, shutdown_trigger)
                    nursery.start_soon(partial(
                        trio.serve_listeners,
                        partial(server_cls, wrapped, config, context,
                                ConnectionState(state.copy())),
                        listeners, handler_nursery=connections))
            except BaseExceptionGroup as group:
                _, other = group.split(ShutdownError)
                if other is not None:
                    raise other
            except ShutdownError:
                pass
            finally:
                for listener in listeners:
                    with trio.CancelScope(shield=True):
                        await listener.aclose()
                await context.terminated.set()
                for connection in list(live):
                    connection.close_if_idle()
                connections.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()

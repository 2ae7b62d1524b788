"""What both apps (the model server's, server/app.py, and the router's,
server/router/app.py) wrap around their routes: the per-request ASGI
wrapper, upstream's error answers and Server header, and the API-key check.
"""

from __future__ import annotations

import hmac
import logging
from contextlib import nullcontext

import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from ... import __version__
from ...config import ServerConfig
from ...logging_setup import TRACE
from ...protocol.routes import QUIET_PATHS, ROUTES
from .body_limits import media_body_limits, sized_request_class
from .errors import (
    JSON_TYPE,
    ApiError,
    dumps,
    error_response,
    header_too_large,
    not_found,
    payload_too_large,
    request_timeout,
)
from .half_close import Answer, HalfClosePolicy, send_empty_ok
from .resources import SCOPE_KEY, RequestResources
from .watchdog import RequestWatchdog

log = logging.getLogger("mlxcel.http")

BUILD_INFO = f"mlxcel-trio-{__version__}"
MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_HEAD_BYTES = 16 * 1024  # the request line and headers (h11 also caps a partial head)


def shell_app(name: str, config: ServerConfig) -> QuartTrio:
    """A QuartTrio app with what the server and the router share: no
    response timeout, --timeout for bodies, and each route's body limit
    (media routes to the image budget, which a router's children apply)."""
    app = QuartTrio(name)
    app.config.update(RESPONSE_TIMEOUT=None, BODY_TIMEOUT=config.timeout,
                      MAX_CONTENT_LENGTH=MAX_BODY_BYTES)
    app.request_class = sized_request_class(media_body_limits(
        ROUTES, config.api_prefix, config.max_image_payload_size, config.max_images,
        MAX_BODY_BYTES))
    return app


async def _send_error(send, err: ApiError) -> None:
    """An error answered below Quart (the request never reaches it)."""
    body = dumps(err.body()).encode()
    await send({"type": "http.response.start", "status": err.status, "headers": [
        (b"content-type", JSON_TYPE.encode()), (b"content-length", str(len(body)).encode()),
        (b"server", b"llama.cpp"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def _has_body(headers) -> bool:
    for k, v in headers:
        k = k.lower()
        if k == b"transfer-encoding" or (k == b"content-length" and v.strip() not in (b"", b"0")):
            return True
    return False


class PerRequest:
    """ASGI wrapper: gives each request its `RequestResources` (in the ASGI
    scope) and closes them once the request is over, however it ended.

    It also closes the connection after an answer given before the request
    body was read to its end (the gate's 401 or 503, a 404, a stub route):
    the unread rest would otherwise stay on the kept-alive connection and
    hang the client's next request on it.

    The response's last message is sent shielded from cancellation: hypercorn
    recycles the connection inside that send (test_listen.py shows a
    pending cancel leaving it deaf to its next request otherwise).

    With a watchdog (http/watchdog.py) the request is watched while it runs:
    each body message received and each response message sent is progress.

    With a half-close policy (http/half_close.py), a client that shuts its
    sending side after a complete request is answered as upstream answers
    it, rather than its request being cancelled at once."""

    def __init__(self, app, watchdog: RequestWatchdog | None = None,
                 half_close: HalfClosePolicy | None = None) -> None:
        self.app = app
        self.watchdog = watchdog
        self.half_close = half_close

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        head = len(scope.get("raw_path") or b"") + sum(len(k) + len(v) + 4
                                                       for k, v in scope.get("headers", ()))
        if head > MAX_HEAD_BYTES:
            return await _send_error(send, header_too_large(MAX_HEAD_BYTES))
        body_done = not _has_body(scope.get("headers", ()))
        tracked = None
        answer = Answer()
        app_scope = trio.CancelScope()
        empty_ok = False   # the app was cancelled for a half-closed client: upstream's 200

        async def receive_tracked():
            nonlocal body_done, empty_ok
            message = await receive()
            if tracked is not None:
                tracked.mark()
            if (message["type"] == "http.disconnect" and body_done and not answer.started
                    and self.half_close is not None):
                # the request arrived whole, then its client's end of input:
                # a half-close, which upstream answers (never given to Quart,
                # which would cancel the request)
                grace, answer.polled = self.half_close.grace_s(scope.get("method", ""),
                                                               scope.get("path", ""))
                if not await answer.finished_within(grace):
                    empty_ok = answer.polled and not answer.started
                    app_scope.cancel()
                await trio.sleep_forever()   # cancelled with the app, or once it answered
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        async def send_closing(message):
            if message["type"] == "http.response.start":
                answer.started = True   # before the send: no other answer may start
            if not body_done and message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", ())
                           if k.lower() != b"connection"]
                message = {**message, "headers": headers + [(b"connection", b"close")]}
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                # hypercorn readies the kept-alive connection for its next
                # request inside this last send, past a checkpoint: a cancel
                # pending here would stop that half-way, and the connection
                # would never answer again (the response itself is whole)
                with trio.CancelScope(shield=True):
                    await send(message)
            else:
                await send(message)
            if answer.sent(message):
                app_scope.cancel()
            if tracked is not None:
                tracked.mark()

        resources = RequestResources()
        with (self.watchdog.track(scope.get("method", ""), scope.get("path", ""))
              if self.watchdog is not None else nullcontext()) as tracked:
            try:  # a fresh scope: an in-process sub-request (Vertex) gets its own
                with app_scope:
                    await self.app({**scope, SCOPE_KEY: resources}, receive_tracked,
                                   send_closing)
            finally:
                resources.close()
            if empty_ok and not answer.started:
                await send_empty_ok(send_closing)


def answer_errors(app: QuartTrio, config: ServerConfig) -> None:
    """Every failure as upstream's JSON error (404/405 as "File Not Found",
    408/413 closing the connection, the rest by type), and upstream's
    Server header on every answer; the router's app uses the same."""

    @app.errorhandler(ApiError)
    async def _on_api_error(err: ApiError):
        return error_response(err)

    @app.errorhandler(HTTPException)
    async def _on_http_error(err: HTTPException):
        if err.code in (404, 405):
            return not_found()
        if err.code in (408, 413):  # the body is left unread: close the connection
            limit = request.max_content_length or MAX_BODY_BYTES  # the path's own (body_limits)
            resp = error_response(payload_too_large(limit) if err.code == 413
                                  else request_timeout(config.timeout))
            resp.headers["Connection"] = "close"
            return resp
        kind = "invalid_request_error" if err.code < 500 else "server_error"
        return error_response(ApiError(err.description or err.name, kind, status=err.code))

    @app.errorhandler(Exception)
    async def _on_error(err: Exception):
        log.exception("request failed")
        return error_response(ApiError(str(err) or type(err).__name__, "server_error"))

    @app.after_request
    async def _headers(resp: Response):
        resp.headers["Server"] = "llama.cpp"
        if request.path not in QUIET_PATHS:  # route, status; never a body
            log.log(TRACE, "done request: %s %s %s %d", request.method, request.path,
                    request.remote_addr, resp.status_code)
        return resp


def api_key_index(keys: list[bytes]) -> int:
    """Upstream's reading: Authorization, or X-Api-Key when that is empty, less
    a "Bearer " prefix; compared in constant time against every key.  The
    index of the matching key, or -1."""
    supplied = request.headers.get("Authorization", "") or request.headers.get("X-Api-Key", "")
    if supplied.startswith("Bearer "):
        supplied = supplied[7:]
    candidate = supplied.encode()
    which = -1
    for i, key in enumerate(keys):
        match = hmac.compare_digest(candidate, key)
        which = max(which, i * match - (not match))  # no branch on the outcome
    return which

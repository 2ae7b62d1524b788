"""CORS, as llama-server applies it: before routing, before the API key.

Every response carries Access-Control-Allow-Origin:

* --cors-origins "*" with credentials on (the defaults): the request's
  Origin echoed back, empty when the request has none;
* --cors-origins "localhost": the Origin echoed only when its host is
  localhost, 127.0.0.1 or ::1 (any port); no header otherwise;
* anything else: the option's text as given (a list stays a list).

An OPTIONS request to any path is answered right here, 200 with an empty
text/html body, adding Allow-Credentials, Allow-Methods and Allow-Headers
(those three on preflights only).  No Access-Control-Expose-Headers is ever
sent.  This runs as the outermost ASGI layer, so the key check, the loading
gate and the router never see an OPTIONS request.

Being outermost, it also writes every response header name the way
llama-server's HTTP library does, in canonical case (Content-Type,
Access-Control-Allow-Origin, Process-Start-Time-Unix; ETag): Quart hands
them down lower-cased, and a client that compares names exactly (a plain
dict of the headers) would not find them.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

import attrs

log = logging.getLogger("mlxcel.http")


def origin_is_localhost(origin: str) -> bool:
    try:
        host = urlsplit(origin).hostname
    except ValueError:
        return False
    return host in ("localhost", "127.0.0.1", "::1")


@attrs.frozen
class CorsPolicy:
    origins: str = "*"
    methods: str = "GET, POST, DELETE, OPTIONS"
    headers: str = "*"
    credentials: bool = True

    def allow_origin(self, origin: str) -> str | None:
        """The Access-Control-Allow-Origin value for a request's Origin
        ("" when it sent none), or None for no header."""
        if self.credentials and self.origins == "*":
            return origin
        if self.origins == "localhost":
            if origin and origin_is_localhost(origin):
                return origin
            if origin:
                log.warning("(CORS) not echoing a non-localhost origin: %s", origin)
            return None
        return self.origins

    def preflight(self) -> list[tuple[str, str]]:
        return [("Access-Control-Allow-Credentials", "true" if self.credentials else "false"),
                ("Access-Control-Allow-Methods", self.methods),
                ("Access-Control-Allow-Headers", self.headers)]


# Names whose canonical spelling is not Word-Word capitalisation.
_SPELLED = {b"etag": b"ETag"}


def canonical_name(name: bytes) -> bytes:
    """A header name in canonical case: each dash-separated word capitalised."""
    lower = name.lower()
    return _SPELLED.get(lower) or b"-".join(w[:1].upper() + w[1:] for w in lower.split(b"-"))


def canonical_headers(headers) -> list[tuple[bytes, bytes]]:
    return [(canonical_name(k), v) for k, v in headers]


def _latin1(text: str) -> bytes:
    return text.encode("latin-1", "replace")


class CorsMiddleware:
    """ASGI wrapper: answers OPTIONS, stamps the Allow-Origin header."""

    def __init__(self, app, policy: CorsPolicy, extra_headers: list[tuple[str, str]]) -> None:
        self.app = app
        self.policy = policy
        self.extra = [(_latin1(k.lower()), _latin1(v)) for k, v in extra_headers]

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        origin = ""
        for name, value in scope.get("headers", ()):
            if name.lower() == b"origin":
                origin = value.decode("latin-1")
                break
        allow = self.policy.allow_origin(origin)
        stamp = [] if allow is None else [(b"access-control-allow-origin", _latin1(allow))]
        if scope["method"] == "OPTIONS":
            headers = [*stamp, *((_latin1(k.lower()), _latin1(v))
                                 for k, v in self.policy.preflight()),
                       (b"content-type", b"text/html"), (b"content-length", b"0"), *self.extra]
            await send({"type": "http.response.start", "status": 200,
                        "headers": canonical_headers(headers)})
            await send({"type": "http.response.body", "body": b""})
            return None

        async def stamped(message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                if stamp:
                    headers = [*stamp, *((k, v) for k, v in headers
                                         if k.lower() != b"access-control-allow-origin")]
                message = {**message, "headers": canonical_headers(headers)}
            await send(message)

        return await self.app(scope, receive, stamped)

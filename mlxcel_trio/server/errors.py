"""Upstream error envelopes: the single author of every error body.

Wording, types and status codes follow llama-server.  Handlers raise
`ApiError` (or let a `FieldError` from request parsing propagate); the app's
error handler turns it into a response at one boundary.
"""

from __future__ import annotations

import json

from quart import Response

STATUS_OF_TYPE = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "server_error": 500,
    "not_supported_error": 501,
    "unavailable_error": 503,
    "exceed_context_size_error": 400,
}

JSON_TYPE = "application/json; charset=utf-8"


class ApiError(Exception):
    """An error with an upstream type; the HTTP status follows from it."""

    def __init__(self, message: str, type: str = "invalid_request_error",
                 extra: dict | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.type = type
        self.extra = extra or {}

    @property
    def status(self) -> int:
        return STATUS_OF_TYPE.get(self.type, 500)

    def body(self) -> dict:
        """format_error_response's key order: code, message, type (+extra)."""
        err = {"code": self.status, "message": self.message, "type": self.type}
        err.update(self.extra)
        return {"error": err}


def json_response(obj, status: int = 200) -> Response:
    return Response(json.dumps(obj, ensure_ascii=False, separators=(",", ":")),
                    status=status, content_type=JSON_TYPE)


def error_response(err: ApiError) -> Response:
    return json_response(err.body(), err.status)


def _middleware_error(message: str, type: str, code: int) -> Response:
    # The HTTP middleware builds these by hand: message, type, code.
    return json_response({"error": {"message": message, "type": type, "code": code}}, code)


def not_found() -> Response:
    return _middleware_error("File Not Found", "not_found_error", 404)


def loading() -> Response:
    return _middleware_error("Loading model", "unavailable_error", 503)


def invalid_api_key() -> Response:
    return _middleware_error("Invalid API Key", "authentication_error", 401)


# nlohmann::json type names, as its type_error messages spell them
def json_type_name(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def parse_error(exc: json.JSONDecodeError) -> ApiError:
    """A malformed body: upstream answers 500 with the JSON library's text."""
    last = exc.doc[exc.pos:exc.pos + 1] if exc.doc else ""
    return ApiError(
        f"[json.exception.parse_error.101] parse error at line {exc.lineno}, "
        f"column {exc.colno}: syntax error while parsing value - {exc.msg}; "
        f"last read: '{last}'",
        "server_error",
    )

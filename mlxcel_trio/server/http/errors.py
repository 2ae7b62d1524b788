"""Upstream error envelopes: the single author of every error body.

Wording, types and status codes follow llama-server.  Handlers raise
`ApiError` (request parsing too; an engine `Failed` becomes one through
`ApiError.from_failed`); the app's error handler turns it into a response
at one boundary.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

from quart import Response

if TYPE_CHECKING:
    from ...protocol.records import Failed

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

# The engine's coded failures (protocol/records.py FAILURE_CODES), which the
# server also raises where it finds the same fault first: upstream's type and
# sentence, filled from the numbers the failure carries (also in the body)
# and its other words (only in the sentence).
NOT_SUPPORTED = "This server does not support {what}. Start it with `{flag}`"
RESTORE_FAILED = "Unable to restore slot: "
ENGINE_FAILURES: dict[str, tuple[str, str]] = {
    "invalid_slot": ("invalid_request_error", "Invalid slot ID"),
    "invalid_tokens": ("invalid_request_error", "Prompt contains invalid tokens"),
    "empty_input": ("invalid_request_error", "Input content cannot be empty"),
    "untokenizable": ("invalid_request_error", "Failed to tokenize prompt"),
    "exceeds_context": ("exceed_context_size_error",
                        "request ({n_prompt_tokens} tokens) exceeds the available context "
                        "size ({n_ctx} tokens), try increasing it"),
    "no_embeddings": ("not_supported_error",
                      NOT_SUPPORTED.format(what="embeddings", flag="--embeddings")),
    "no_reranking": ("not_supported_error",
                     NOT_SUPPORTED.format(what="reranking", flag="--reranking")),
    "no_generation": ("not_supported_error",
                      "This server does not support generation: it serves {serves}"),
    "no_audio_model": ("not_supported_error", "The current model does not support audio input."),
    "no_audio_tower": ("not_supported_error", "audio input is not supported - hint: the loaded "
                                              "checkpoint has no audio tower"),
    "no_image_tower": ("not_supported_error", "image input is not supported - hint: the loaded "
                                              "checkpoint has no image tower"),
    "exceeds_batch": ("server_error", "input ({n_tokens} tokens) is too large to process. "
                                      "increase the physical batch size (current batch size: "
                                      "{n_batch})"),
    "embed_exceeds_context": ("exceed_context_size_error",
                              "input ({n_prompt_tokens} tokens) is larger than the max context "
                              "size ({n_ctx} tokens). skipping"),
    "unknown_language": ("invalid_request_error",
                         "language '{language}' is not one this model transcribes"),
    "audio_too_long": ("invalid_request_error", "audio clip is longer than {max_seconds} s"),
    "slot_busy": ("unavailable_error", "slot {slot} is processing a task; retry when it is idle"),
    "restore_too_long": ("invalid_request_error",
                         RESTORE_FAILED + "Restored prompt does not fit in the slot context"),
    "restore_invalid_tokens": ("invalid_request_error",
                               RESTORE_FAILED + "Invalid tokens in slot save file"),
    "shift_shared_prompt": ("server_error", "context shift cannot be used for shared prompt"),
    # unified KV: the live sequences outgrew the shared budget (engine/kv_budget.py)
    "context_exceeded": ("server_error", "Context size has been exceeded."),
}

# The router's own refusals (server/router/): upstream's type and sentence
# per code; the words fill the sentence.  Upstream answers an unknown model
# 404 on load but 400 on unload, hence two rows with one sentence.
NO_SUCH_MODEL = "model is not found"
ROUTER_FAILURES: dict[str, tuple[str, str]] = {
    "model_missing": ("invalid_request_error", "model name is missing from the request"),
    "model_unknown": ("invalid_request_error", "model '{name}' not found"),
    "model_not_loaded": ("invalid_request_error", "model is not loaded"),
    "body_not_json": ("invalid_request_error", "the request body is not JSON; the router reads "
                                               "its \"model\" field to pick the model"),
    "stream_unknown": ("not_found_error", "Stream not found or expired"),
    "model_not_string": ("invalid_request_error", "model must be a non-empty string"),
    "not_a_repo_id": ("invalid_request_error",
                      "model '{name}' is not a Hugging Face repo id (owner/name)"),
    "download_refused": ("invalid_request_error",
                         "model validation failed, unable to download: {why}"),
    "model_exists": ("invalid_request_error", "model '{name}' already exists"),
    "load_unknown": ("not_found_error", NO_SUCH_MODEL),
    "unload_unknown": ("invalid_request_error", NO_SUCH_MODEL),
    "already_running": ("invalid_request_error", "model is already running"),
    "not_running": ("invalid_request_error", "model is not running"),
    "remove_unknown": ("server_error", "model name={name} is not found"),
    "not_removable": ("server_error", "model name={name} is not removable (not from cache)"),
    "load_failed": ("unavailable_error", "model name={name} failed to load"),
    "models_max": ("server_error", "model limit reached, try again later"),
    "child_unreachable": ("unavailable_error", "model name={name} is unavailable: {why}"),
}


def router_error(code: str, **words: str) -> "ApiError":
    """ROUTER_FAILURES' error for `code`, its sentence filled with `words`."""
    kind, sentence = ROUTER_FAILURES[code]
    return ApiError(sentence.format(**words), kind)


class ApiError(Exception):
    """An error with an upstream type; the HTTP status follows from it."""

    def __init__(self, message: str, type: str = "invalid_request_error",
                 extra: dict | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.type = type
        self.extra = extra or {}
        self._status = status

    @classmethod
    def from_failed(cls, ev: "Failed") -> "ApiError":
        """An engine job's failure, as the error the client is answered: a
        coded one in the words of ENGINE_FAILURES."""
        if ev.code:
            return engine_failure(ev.code, dict(ev.words), **dict(ev.extra))
        return cls(ev.message, ev.kind, dict(ev.extra))

    @property
    def status(self) -> int:
        """The type's status, unless the error names its own (413, 408)."""
        return self._status or STATUS_OF_TYPE.get(self.type, 500)

    def body(self) -> dict:
        """format_error_response's key order: code, message, type (+extra)."""
        err = {"code": self.status, "message": self.message, "type": self.type}
        err.update(self.extra)
        return {"error": err}


def engine_failure(code: str, words: dict[str, str | int] | None = None,
                   **numbers: int) -> ApiError:
    """ENGINE_FAILURES' error for `code`; the numbers fill the sentence and
    follow it in the body (upstream's n_prompt_tokens, n_ctx), the words
    fill it only."""
    kind, sentence = ENGINE_FAILURES[code]
    return ApiError(sentence.format(**numbers, **(words or {})), kind, numbers or None)


def _finite(obj):
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def dumps(obj) -> str:
    """nlohmann's dump(): compact, UTF-8, and a non-finite float (a request's
    1e39 in a float member) written as null, so every body is strict JSON."""
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return json.dumps(_finite(obj), ensure_ascii=False, separators=(",", ":"))


def json_response(obj, status: int = 200) -> Response:
    return Response(dumps(obj), status=status, content_type=JSON_TYPE)


def error_response(err: ApiError) -> Response:
    return json_response(err.body(), err.status)


def _middleware_error(message: str, type: str, code: int) -> Response:
    # The HTTP middleware builds these by hand: message, type, code.
    return json_response({"error": {"message": message, "type": type, "code": code}}, code)


def not_found() -> Response:
    return _middleware_error("File Not Found", "not_found_error", 404)


def loading() -> Response:
    return _middleware_error("Loading model", "unavailable_error", 503)


def shutting_down(message: str) -> Response:
    """A request reaching the app during SIGTERM's drain (server/drain.py)."""
    return _middleware_error(message, "unavailable_error", 503)


def feature_disabled() -> Response:
    """upstream's res_403 stub body: no `code` key."""
    return json_response({"error": {"message": "this feature is disabled",
                                    "type": "feature_disabled"}}, 403)


def not_supported(what: str, flag: str) -> Response:
    """The 501 llama-server answers for a feature it was started without."""
    return error_response(ApiError(NOT_SUPPORTED.format(what=what, flag=flag),
                                   "not_supported_error"))


def not_generating(flag: str) -> Response:
    """The 501 a generation route answers on a server started with
    --embeddings or --reranking (it has no chat model)."""
    return error_response(ApiError(f"This server does not support completions. Start it "
                                   f"without `{flag}`", "not_supported_error"))


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


# A body that cannot be read as a request is the client's error.  Upstream
# answers these with 500 server_error (its exception boundary maps every
# JSON-library exception to 500); we answer the 400 invalid_request_error it
# meant, with the same wording (manifest: routes.json, divergence on each
# JSON route).
BAD_BODY = "invalid_request_error"


def payload_too_large(limit: int) -> ApiError:
    """A body over the limit, refused from its Content-Length (or once the
    limit is passed) before anything is parsed: OpenAI's 413 shape."""
    return ApiError(f"Request body too large: the limit is {limit} bytes",
                    "invalid_request_error", status=413)


def header_too_large(limit: int) -> ApiError:
    return ApiError(f"Request header fields too large: the limit is {limit} bytes",
                    "invalid_request_error", status=431)


def request_timeout(seconds: float) -> ApiError:
    return ApiError(f"Request body not received within {seconds:g} seconds (--timeout)",
                    "invalid_request_error", status=408)


def too_deep(limit: int) -> ApiError:
    return ApiError(f"Request body nests arrays and objects more than {limit} levels deep",
                    "invalid_request_error")


def parse_error(exc: json.JSONDecodeError) -> ApiError:
    """A malformed body, in the JSON library's (nlohmann's) words."""
    last = exc.doc[exc.pos:exc.pos + 1] if exc.doc else ""
    return ApiError(
        f"[json.exception.parse_error.101] parse error at line {exc.lineno}, "
        f"column {exc.colno}: syntax error while parsing value - {exc.msg}; "
        f"last read: '{last}'",
        BAD_BODY,
    )


def _line_col(doc: str, pos: int) -> tuple[int, int]:
    return doc.count("\n", 0, pos) + 1, pos - doc.rfind("\n", 0, pos)


def parse_error_at(doc: str, pos: int, detail: str, last: str) -> ApiError:
    """A body Python's json accepts but nlohmann rejects (NaN, Infinity, a
    lone surrogate escape); `pos` is the index of the last character read."""
    line, col = _line_col(doc, pos)
    return ApiError(f"[json.exception.parse_error.101] parse error at line {line}, column {col}: "
                    f"{detail}; last read: '{last}'", BAD_BODY)


def empty_input() -> ApiError:
    return ApiError("[json.exception.parse_error.101] parse error at line 1, column 1: attempting "
                    "to parse an empty input; check that your input string or stream contains "
                    "the expected JSON", BAD_BODY)


def number_overflow(text: str) -> ApiError:
    return ApiError(f"[json.exception.out_of_range.406] number overflow parsing '{text}'",
                    BAD_BODY)


def type_mismatch(expected: str, value, field: str | None = None) -> str:
    """nlohmann's text for a value of the wrong type (`expected`: "string",
    "number", ...), as upstream's json_value and get<T> throw it; with
    `field`, prefixed as upstream's params_from_json reports a field."""
    text = f"[json.exception.type_error.302] type must be {expected}, but is " \
           f"{json_type_name(value)}"
    return text if field is None else f"Field '{field}': {text}"


def type_error(expected: str, value, field: str | None = None) -> ApiError:
    """A request value of the wrong type: upstream answers 500 with the
    library text where it is read outside the completion handler's
    try-block (e.g. /tokenize `content`); we answer 400 with the same text."""
    return ApiError(type_mismatch(expected, value, field), BAD_BODY)

"""Google Cloud Vertex AI custom containers (AIP_* environment variables).

Registered only when AIP_MODE=PREDICTION, exactly as llama-server does:

- AIP_HTTP_PORT (default 8080) replaces --port, with a logged warning;
- AIP_HEALTH_ROUTE (leading slash ensured) becomes a GET alias of /health;
- AIP_PREDICT_ROUTE (default /predict) mounts the prediction fan-out.  A
  predict path that is already a route fails startup before the model loads.

Theory of operation of the fan-out: `{"instances": [...]}` (at most 128), each
instance naming its target in `@requestFormat`, either a route's camelCase
alias ("chatCompletions", "applyTemplate"; derived from the route table, so
a new route is aliased automatically) or a registered path verbatim.  The
field is stripped, a `stream` field is forced off, and the rest is sent
through the app's own ASGI stack in-process with the predict request's
headers, so the loading gate, API-key check, body limits and validation are
the ones a direct call meets.  At most MAX_CONCURRENT instances run at once
(upstream launches all of them); results come back in request order, a
failed instance as its error body in its place.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import trio

from ...protocol.routes import ROUTES
from ..http.body import parse_body
from ..http.errors import ApiError, dumps, json_response

log = logging.getLogger("mlxcel.gcp")

MAX_CONCURRENT = 8
MAX_INSTANCES = 128


def request_format(path: str) -> str:
    """upstream's path_to_gcp_format: drop a leading /v1 and the slash, then
    camelCase on '/', '-' and '_', stopping at a path parameter."""
    s = path[3:] if len(path) > 3 and path.startswith("/v1") else path
    s = s.removeprefix("/")
    out: list[str] = []
    cap = False
    for c in s:
        if c == ":":
            break
        if c in "/-_":
            cap = True
        else:
            out.append(c.upper() if cap else c)
            cap = False
    return "".join(out)


def targets() -> tuple[dict[str, str], dict[str, str]]:
    """(alias -> path, path -> method) from the route table.  A path's first
    registered method serves it (upstream keys its handler map by path).  On
    an alias collision the /v1 route wins ("completions" is /v1/completions),
    where upstream's unordered map leaves the winner unspecified."""
    methods: dict[str, str] = {}
    for r in ROUTES:
        if not r.vertex:
            methods.setdefault(r.path, r.method)
    aliases: dict[str, str] = {}
    for path in methods:
        alias = request_format(path)
        if alias not in aliases or (path.startswith("/v1/") and
                                    not aliases[alias].startswith("/v1/")):
            aliases[alias] = path
    return aliases, methods


def _error(message: str, type_: str = "invalid_request_error") -> dict:
    return {"error": ApiError(message, type_).body()["error"]}


def _refuse(message: str):
    return json_response(_error(message), status=400)


class Predictor:
    """POST AIP_PREDICT_ROUTE, dispatching into `asgi` (the app below CORS)."""

    def __init__(self, asgi, prefix: str) -> None:
        self.asgi = asgi
        self.prefix = prefix
        self.aliases, self.methods = targets()

    async def predict(self, raw: bytes, scope: dict) -> Any:
        try:
            data = parse_body(raw)
        except ApiError as err:
            return _refuse(err.message)
        if not isinstance(data, dict):
            return _refuse("request body must be a JSON object")
        instances = data.get("instances")
        if not isinstance(instances, list):
            return _refuse("request body must include an array field named instances")
        if len(instances) > MAX_INSTANCES:
            return _refuse(f"instances array exceeds maximum size of {MAX_INSTANCES}")
        results: list[Any] = [None] * len(instances)
        limiter = trio.CapacityLimiter(MAX_CONCURRENT)

        async def one(i: int, instance: Any) -> None:
            async with limiter:
                results[i] = await self._instance(instance, scope)

        async with trio.open_nursery() as nursery:
            for i, instance in enumerate(instances):
                nursery.start_soon(one, i, instance)
        return json_response({"predictions": results})

    async def _instance(self, instance: Any, scope: dict) -> Any:
        if not isinstance(instance, dict):
            return _error("each instance must be a JSON object")
        fmt = instance.get("@requestFormat")
        if not isinstance(fmt, str):
            return _error("each instance must include a string @requestFormat")
        payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
        if "stream" in payload:
            log.warning("ignoring client-provided stream field in instance, streaming is not "
                        "supported in predict route")
            payload["stream"] = False
        path = self.aliases.get(fmt) or (fmt if fmt in self.methods else None)
        if path is None:
            return _error(f"no handler registered for @requestFormat: {fmt}")
        try:
            return await self._dispatch(self.methods[path], path, payload, scope)
        except ApiError as err:
            return _error(err.message, err.type)
        except Exception as exc:  # one instance fails, not the batch
            log.exception("predict instance failed")
            return _error(str(exc) or type(exc).__name__, "server_error")

    async def _dispatch(self, method: str, path: str, payload: dict, outer: dict) -> Any:
        body = dumps(payload).encode() if method != "GET" else b""
        headers = [(k, v) for k, v in outer.get("headers", ())
                   if k.lower() not in (b"content-length", b"content-type", b"transfer-encoding")]
        headers += [(b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())]
        full = self.prefix + path
        scope = {**outer, "method": method, "path": full, "raw_path": full.encode(),
                 "headers": headers}
        sent = False

        async def receive():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await trio.sleep_forever()  # never a disconnect: the outer request owns that

        chunks: list[bytes] = []
        streaming = False

        async def send(message):
            nonlocal streaming
            if message["type"] == "http.response.start":
                ctype = dict(message.get("headers", ())).get(b"content-type", b"")
                streaming = ctype.startswith(b"text/event-stream")
            elif message["type"] == "http.response.body" and not streaming:
                chunks.append(message.get("body", b""))

        await self.asgi(scope, receive, send)
        if streaming:
            raise ApiError("predict route does not support streaming responses")
        data = b"".join(chunks)
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return data.decode("utf-8", "replace")

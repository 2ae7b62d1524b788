"""A client that shuts its sending side once its request is sent.

Such a client (`shutdown(SHUT_WR)`: a FIN after a complete request) still
reads.  hypercorn passes the end of its input on as `http.disconnect`, on
which Quart cancels the request, so it used to get the connection closed
with no answer on every route.  llama-server answers it as follows, and so
do we (the ASGI wrapper in app_shell.py applies it):

- The routes whose upstream handler waits on the engine and looks at the
  connection while it waits (`POLLED`: the completion and chat family,
  embeddings and rerank, transcriptions, the slot routes, the LoRA routes,
  the reasoning control, /metrics): upstream looks once a second (its
  polling interval), so an answer ready within that second is sent whole;
  past it the task is cancelled and the answer is an empty 200.
- Every other route is answered whole (bounded by OTHER_GRACE_S here, so
  that a long response cannot run on for a client that may be gone).

On those routes a stream whose head is sent after the end of input stops
right after its head (upstream's stream looks at the connection before its
first frame).  A stream already under way when the end of input arrives is
cancelled at once, as before: its client is treated as gone.  The same holds for a
request whose body had not fully arrived.  A client that closed its socket
altogether looks the same as a half-closed one until a write fails, as it
does to upstream; the bytes then go nowhere.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import trio

from ...protocol.routes import Route

POLL_S = 1.0          # upstream's polling interval on its engine routes
OTHER_GRACE_S = 10.0  # how long another route may take to answer a half-closed client

# handlers (server/app.py's table) whose upstream counterpart polls the connection
POLLED = frozenset({
    "completion", "v1_completions", "infill", "chat_completions", "anthropic_messages",
    "responses", "embeddings", "v1_embeddings", "rerank", "transcriptions", "slots",
    "slot_actions", "metrics", "lora_adapters", "set_lora_adapters", "chat_control",
    "vertex_predict",
})


def _pattern(path: str) -> str:
    return "/".join("[^/]+" if part.startswith(":") else re.escape(part)
                    for part in path.split("/"))


class HalfClosePolicy:
    """Which requests upstream cancels when their client half-closes."""

    def __init__(self, routes: Iterable[Route], prefix: str = "",
                 extra: Iterable[tuple[str, str]] = ()) -> None:
        """`extra`: (method, path) pairs mounted at run time and polled
        (the Vertex predict route)."""
        pairs = [(r.method, r.path) for r in routes
                 if r.handler in POLLED and not r.vertex and not r.router]
        pairs += list(extra)
        self._polled = {method: re.compile("|".join(
            f"(?:{re.escape(prefix)}{_pattern(path)})" for m, path in pairs if m == method))
            for method in {m for m, _ in pairs}}

    def grace_s(self, method: str, path: str) -> tuple[float, bool]:
        """How long the request may still take to answer whole, and
        whether past that it is answered with upstream's empty 200."""
        pattern = self._polled.get(method)
        if pattern is not None and pattern.fullmatch(path):
            return POLL_S, True
        return OTHER_GRACE_S, False


class Answer:
    """What the wrapped app has sent of its response so far."""

    __slots__ = ("started", "finished", "polled", "_done")

    def __init__(self) -> None:
        self.started = False
        self.finished = False
        self.polled = False   # its client half-closed, on a route upstream polls
        self._done: trio.Event | None = None   # made only when someone waits

    def sent(self, message) -> bool:
        """Record a message sent; True when the request should stop here: a
        stream whose client half-closed gets its head and nothing more, as
        upstream's stream looks at the connection before its first frame."""
        if message["type"] == "http.response.start":
            self.started = True
            return self.polled and any(
                k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                for k, v in message.get("headers", ()))
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.finished = True
            if self._done is not None:
                self._done.set()
        return False

    async def finished_within(self, seconds: float) -> bool:
        if not self.finished:
            self._done = trio.Event()
            with trio.move_on_after(seconds):
                await self._done.wait()
        return self.finished


async def send_empty_ok(send) -> None:
    """Upstream's answer to a half-closed client whose engine task it
    cancelled: a 200 with no body."""
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json; charset=utf-8"), (b"content-length", b"0"),
        (b"server", b"llama.cpp")]})
    await send({"type": "http.response.body", "body": b""})

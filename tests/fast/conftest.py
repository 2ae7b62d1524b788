"""The fast tier: the real app in-process, against a scripted engine.

`serve(*argv, env=..., script=...)` builds the config a command line would
(cli.main.prepare, so flags and LLAMA_ARG_* / AIP_* read as in production),
runs a `Bridge` with a `FakeEngine` and the stream-session registry in the
test's nursery, waits for `Loaded`, and returns the app with Quart's test
client.  No model, no subprocess, no socket: the requests go through the
whole ASGI stack (CORS, cleanups, gate, handlers, error boundary).

Streaming responses are read with `sse()`, which drives the connection
itself: Quart's `client.post` buffers ten body chunks before anyone reads
them, so a longer stream would block it.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from quart_trio import QuartTrio

from mlxcel_trio.bridge import Bridge
from mlxcel_trio.cli.main import prepare
from mlxcel_trio.config import ServerConfig
from mlxcel_trio.engine.vocab import Vocab
from mlxcel_trio.server.app import create_app

from .fake_engine import (FakeEngine, Script, embedder_info, model_info,
                          write_tokenizer_checkpoint)

MODEL_NAME = "fake-model"
READY_S = 10.0
JSON_TYPE = "application/json; charset=utf-8"
SSE_TYPE = "text/event-stream"


def pytest_collection_modifyitems(items) -> None:
    """Every test in this directory is of the fast tier (`-m fast`)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.fast)


def _matches(route_path: str, path: str) -> bool:
    """Whether a request path is an instance of a route table path
    (`:name` matches one segment; a `$AIP_*` path, set from the
    environment, matches any)."""
    if route_path.startswith("$"):
        return True
    want, got = route_path.split("/"), path.split("?")[0].split("/")
    return len(want) == len(got) and all(w.startswith(":") or w == g for w, g in zip(want, got))


@pytest.fixture
def hits() -> list[tuple[str, str]]:
    """(method, path) of every request the test's servers answered."""
    return []


@pytest.fixture(autouse=True)
def _route_marks_are_kept(request, hits):
    """A test marked `route("METHOD /path")` must have requested that route:
    the marks feed test_route_coverage.py, so they may not lie."""
    yield
    for mark in request.node.iter_markers("route"):
        for spec in mark.args:
            method, path = spec.split(" ", 1)
            assert any(m == method and _matches(path, p) for m, p in hits), (
                f"{request.node.name} is marked as testing {spec} but never requested it")


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> Path:
    path = write_tokenizer_checkpoint(tmp_path_factory.mktemp("fake-checkpoint"))
    (path / "model.safetensors").write_bytes(b"")  # the shape check wants one
    return path


@pytest.fixture(scope="session")
def vocab(checkpoint) -> Vocab:
    return Vocab(checkpoint)


@attrs.define
class Harness:
    """One in-process server: its app, Quart's test client for it, the
    bridge and the fake engine behind it, and the requests it answered."""

    app: QuartTrio
    client: Any
    bridge: Bridge
    config: ServerConfig
    engine: FakeEngine
    hits: list[tuple[str, str]]

    async def post(self, path: str, body: Any = None, *, raw: bytes | None = None,
                   headers: dict | None = None):
        """A non-streaming POST; `raw` sends bytes as they are."""
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        data = raw if raw is not None else json.dumps(body).encode()
        return await self.open(path, method="POST", data=data, headers=hdrs)

    async def get(self, path: str, headers: dict | None = None):
        return await self.open(path, method="GET", headers=headers or {})

    async def open(self, path: str, *, method: str, **kw):
        """Any request, whole (not for long streams: see `sse`)."""
        self.hits.append((method, path))
        return await self.client.open(path, method=method, **kw)

    async def sse(self, path: str, body: Any, *, headers: dict | None = None,
                  method: str = "POST", limit_s: float = READY_S) -> Streamed:
        """A whole streamed response, read chunk by chunk as a client would."""
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        chunks: list[bytes] = []
        self.hits.append((method, path))
        with trio.fail_after(limit_s):
            async with self.client.request(path, method=method, headers=hdrs) as conn:
                await conn.send(json.dumps(body).encode() if body is not None else b"")
                await conn.send_complete()
                while True:
                    try:
                        chunks.append(await conn.receive())
                    except trio.EndOfChannel:
                        break
        return Streamed(conn.status_code, conn.headers, b"".join(chunks))

    async def read_then_disconnect(self, path: str, body: Any, *, chunks: int = 1,
                                   headers: dict | None = None,
                                   meanwhile=None) -> list[bytes]:
        """Read `chunks` body chunks of a response, await `meanwhile(chunks)`
        if given (the request is still open), then go away as a client does
        (the ASGI `http.disconnect` hypercorn sends); returns once the app
        has finished.  Driven at the ASGI level: Quart's test client waits,
        after a disconnect, for a final body chunk that never comes."""
        self.hits.append(("POST", path))
        raw = json.dumps(body).encode()
        hdrs = {"host": "localhost", "content-type": "application/json",
                "content-length": str(len(raw)), **(headers or {})}
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
                 "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50000),
                 "server": ("127.0.0.1", 8080), "extensions": {},
                 "headers": [(k.lower().encode(), v.encode()) for k, v in hdrs.items()]}
        to_app, app_inbox = trio.open_memory_channel(4)
        from_app, test_inbox = trio.open_memory_channel(64)
        await to_app.send({"type": "http.request", "body": raw, "more_body": False})
        got: list[bytes] = []
        with trio.fail_after(READY_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.app, scope, app_inbox.receive, from_app.send)
                while len(got) < chunks:
                    message = await test_inbox.receive()
                    if message["type"] == "http.response.body" and message.get("body"):
                        got.append(message["body"])
                if meanwhile is not None:
                    await meanwhile(got)
                await to_app.send({"type": "http.disconnect"})
        return got

    async def next_command(self):
        """The next command the engine received, waited for off the trio thread."""
        return await trio.to_thread.run_sync(self.engine.next_command)


@attrs.frozen
class Streamed:
    status_code: int
    headers: Any
    body: bytes

    def frames(self) -> list[str]:
        """The `data:` payloads, in order (comments and event lines left out)."""
        out = []
        for block in self.body.decode().split("\n\n"):
            for line in block.split("\n"):
                if line.startswith("data: "):
                    out.append(line[6:])
        return out

    def events(self) -> list[tuple[str | None, dict]]:
        """(event name, data) per frame, for the `event:`-typed surfaces."""
        out = []
        for block in self.body.decode().split("\n\n"):
            name, data = None, None
            for line in block.split("\n"):
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    data = line[6:]
            if data is not None and data != "[DONE]":
                out.append((name, json.loads(data)))
        return out

    def json_frames(self) -> list[dict]:
        return [json.loads(f) for f in self.frames() if f != "[DONE]"]


@pytest.fixture
def serve(nursery, checkpoint, vocab, hits):
    """Factory: `await serve(*argv, env=None, script=None, load_error=None,
    wait_loaded=True)` -> Harness.  The bridge, the stream sessions and the
    app's lifespan (QuartTrio's app nursery, which background responses
    use) run in the test's nursery, so they end with the test."""
    return partial(_start, nursery, checkpoint, vocab, hits)


async def _start(nursery, checkpoint: Path, vocab: Vocab, hits: list,
                 *argv: str, env: dict | None = None, script: Script | None = None,
                 load_error: str | None = None, wait_loaded: bool = True) -> Harness:
    config = prepare(["-m", str(checkpoint), *argv], env=env or {})
    engines: list[FakeEngine] = []

    def factory(emit) -> FakeEngine:
        info = model_info(config.model, n_slots=config.slots,
                          n_ctx=config.ctx_size or 4096, n_vocab=vocab.n_vocab)
        if config.encoder_mode is not None:  # --embeddings / --reranking: an encoder alone
            role = ("reranker", "rank") if config.rerank_mode else (
                "embedder", config.pooling or "mean")
            info = attrs.evolve(info, generates=False,
                                **{role[0]: embedder_info(role[1], config.model)})
        engine = FakeEngine(emit, info, vocab=vocab, script=script, load_error=load_error)
        engines.append(engine)
        return engine

    bridge = Bridge(config, factory)
    app = create_app(bridge, config, MODEL_NAME)
    await nursery.start(bridge.run)
    await nursery.start(app.mlxcel_state.detached.run)   # as the runner's root nursery does
    await nursery.start(app.mlxcel_state.streams.run)
    await nursery.start(app.mlxcel_state.watchdog.run)
    await nursery.start(_lifespan, app)
    if wait_loaded:
        with trio.fail_after(READY_S):
            await bridge.loaded.wait()
    return Harness(app, app.test_client(), bridge, config, engines[0], hits)


async def _lifespan(app: QuartTrio, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """The ASGI lifespan as hypercorn drives it: started, then held until
    the test's nursery is cancelled (which cancels the app's nursery)."""
    started = trio.Event()
    to_app, from_test = trio.open_memory_channel(1)

    async def send(message: dict) -> None:
        if message["type"] == "lifespan.startup.complete":
            started.set()
        elif message["type"] == "lifespan.startup.failed":
            raise AssertionError(f"app startup failed: {message}")

    async with trio.open_nursery() as inner:
        inner.start_soon(app, {"type": "lifespan", "asgi": {"spec_version": "2.0"}},
                         from_test.receive, send)
        await to_app.send({"type": "lifespan.startup"})
        with trio.fail_after(READY_S):
            await started.wait()
        task_status.started()


def error_of(resp_json: dict, status: int, kind: str) -> str:
    """Upstream's envelope: {"error": {code, message, type}}; the message."""
    assert set(resp_json) == {"error"}, resp_json
    err = resp_json["error"]
    assert err["code"] == status and err["type"] == kind, err
    return err["message"]


def each_route(*specs: str, argname: str = "path"):
    """Parametrize `path` over routes ("METHOD /path"), each case marked
    with its own route (see `_route_marks_are_kept`)."""
    return pytest.mark.parametrize(argname, [
        pytest.param(spec.split(" ", 1)[1], marks=pytest.mark.route(spec), id=spec)
        for spec in specs])

"""Run the server: one trio nursery tree for its whole lifetime.

    trio.run(_main)
    └── root nursery
        ├── bridge.run          the MLX engine thread's owner
        ├── _signals            SIGINT / SIGTERM -> graceful shutdown
        ├── _watch_load         logs readiness, or stops the server on a load failure
        └── hypercorn serve     one task per request

Shutdown: the signal sets `shutdown`; hypercorn stops accepting, gives
in-flight requests `GRACE_S`, then returns; the root scope is cancelled, which
stops the engine thread (bounded by the bridge's own grace).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from functools import partial
from pathlib import Path

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from ..bridge import Bridge
from ..config import ServerConfig
from .app import create_app

log = logging.getLogger("mlxcel.server")

GRACE_S = 5.0


def _model_name(config: ServerConfig) -> str:
    """The alias if given; else the repo id as written, or the directory name."""
    if config.model_alias:
        return config.model_alias
    ref = config.model_ref or config.model
    path = Path(ref)
    return path.name if path.exists() else ref


def _say(line: str) -> None:
    """Lifecycle lines on stdout (tests and operators wait for these)."""
    print(line, flush=True)


async def _signals(signals, shutdown: trio.Event) -> None:
    async for signum in signals:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        shutdown.set()
        return


async def _watch_load(bridge: Bridge, shutdown: trio.Event, status: dict) -> None:
    await bridge.loaded.wait()
    if bridge.load_error:
        print(f"error: failed to load model '{bridge.config.model}': {bridge.load_error}",
              file=sys.stderr, flush=True)
        status["code"] = 1
        shutdown.set()
    else:
        info = bridge.info
        _say(f"main: model loaded ({info.model_type}, {info.dtype}, n_ctx {info.n_ctx}, "
             f"{info.n_slots} slots of {info.n_ctx_slot})")


def _hypercorn_config(config: ServerConfig) -> HypercornConfig:
    hc = HypercornConfig()
    hc.bind = [f"{config.host}:{config.port}"]
    hc.read_timeout = config.timeout if config.timeout > 0 else None
    hc.graceful_timeout = GRACE_S
    hc.include_server_header = False
    hc.accesslog = None
    hc.errorlog = logging.getLogger("hypercorn.error")
    return hc


async def _main(config: ServerConfig) -> int:
    status = {"code": 0}
    bridge = Bridge(config)
    app = create_app(bridge, config, _model_name(config))
    shutdown = trio.Event()
    # Catch signals before anything starts, so a signal during model load is
    # a graceful shutdown too, never a KeyboardInterrupt traceback.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        return await _serve(config, bridge, app, shutdown, signals, status)


async def _serve(config, bridge, app, shutdown, signals, status) -> int:
    async with trio.open_nursery() as root:
        root.start_soon(_signals, signals, shutdown)
        await root.start(bridge.run)
        async with trio.open_nursery() as http:
            binds = await http.start(partial(serve, app, _hypercorn_config(config),
                                             shutdown_trigger=shutdown.wait))
            for b in binds:
                _say(f"main: server is listening on {b}")
            root.start_soon(_watch_load, bridge, shutdown, status)
        root.cancel_scope.cancel()
    return status["code"]


def run(config: ServerConfig) -> int:
    logging.basicConfig(
        level=logging.DEBUG if config.verbose else logging.INFO,
        format="%(asctime)s %(levelname).1s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    code = trio.run(_main, config)
    # Everything is shut down by now (sockets closed, engine thread joined).
    # Skip interpreter finalization: MLX aborts in its static destructors
    # ("terminate called without an active exception") once a model forward
    # has run on a thread other than the main one (measured with mlx 0.32).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

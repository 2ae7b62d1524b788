"""Process code both runners share (server/runner.py for one model,
server/router/runner.py for the router): the shutdown signals and the
startup warnings, so neither runner imports the other's privates.
"""

from __future__ import annotations

import logging
import signal

import trio

from ..config import ServerConfig

log = logging.getLogger("mlxcel.server")


async def watch_signals(signals, shutdown: trio.Event) -> None:
    """Set `shutdown` at the first of `signals` (trio.open_signal_receiver's
    stream), saying which."""
    async for signum in signals:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        shutdown.set()
        return


def warn_open_cors(config: ServerConfig) -> None:
    """Say once that CORS is open to every origin with no API key."""
    if config.cors_origins == "*" and not config.api_keys:
        log.warning("CORS allows every origin ('*') and no API key is set: any web page a "
                    "browser on this network opens can call this server; set --api-key, or "
                    "--cors-origins localhost")

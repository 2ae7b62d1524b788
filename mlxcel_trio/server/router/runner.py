"""The router's process: one trio nursery tree, as the single-model server's.

    trio.run(main)
    └── root nursery
        ├── watch_signals   SIGINT / SIGTERM -> graceful shutdown
        ├── pool.run        every model's child process (stopped on the way out)
        └── listen.serve    hypercorn, one task per connection/request
"""

from __future__ import annotations

import logging
import os
import signal
from functools import partial

import trio

from ...config import ServerConfig
from . import catalog
from .app import create_router_app
from ..http.errors import ApiError
from .pool import Pool, ReadInputs

log = logging.getLogger("mlxcel.router")
logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per forwarded request


async def main(config: ServerConfig, sock, lifecycle, hc, read_inputs: ReadInputs) -> int:
    from ..http import listen
    from ..process import warn_open_cors, watch_signals

    env = {k: v for k, v in os.environ.items() if k not in config.child_env_drop}
    entries = catalog.discover(config.models_dir, os.environ, config.presets)
    glob = config.preset_global
    pool = Pool(entries, config.child_args, config.models_max, env,
                glob.args if glob is not None else (), read_inputs=read_inputs,
                media=config.mmproj_auto)
    app = create_router_app(config, pool, os.environ)
    shutdown = trio.Event()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as root:
            root.start_soon(watch_signals, signals, shutdown)
            await root.start(pool.run)
            for inst in pool.instances.values():
                if inst.entry.load_on_startup:  # a preset's load-on-startup
                    try:
                        pool.start(inst)
                    except ApiError as exc:  # past --models-max
                        log.warning("not loading %s at startup: %s", inst.name, exc.message)
            async with trio.open_nursery() as http:
                await http.start(partial(listen.serve, app, hc, [sock],
                                         write_timeout=config.timeout,
                                         read_timeout=config.timeout + 1,
                                         shutdown_trigger=shutdown.wait))
                address = listen.listening_address(sock, hc.ssl_enabled)
                lifecycle.say(f"main: router is listening on {address}, "
                              f"{len(entries)} model(s) available")
                warn_open_cors(config)
            await app.mlxcel_http.aclose()
            root.cancel_scope.cancel()
    return 0

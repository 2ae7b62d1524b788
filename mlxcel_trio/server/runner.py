"""Run the server: one trio nursery tree for its whole lifetime.

    run(config): install the log sinks (logging_setup), bind the socket
    trio.run(_main)
    └── root nursery
        ├── bridge.run          the MLX engine thread's owner
        ├── detached work       what outlives its request: stream producers, background
        │                       Responses (server/sessions/detached.py)
        ├── stream sessions     X-Conversation-Id TTL sweep (server/sessions/streams.py)
        ├── request watchdog    reports a request without progress (server/http/watchdog.py)
        ├── session store       --session-store: heartbeat, writer, control (sessions/shared.py)
        ├── watch_signals       SIGINT / SIGTERM -> graceful shutdown
        ├── _watch_load         logs readiness, or stops the server on a load failure
        └── listen.serve        hypercorn's protocol, one task per connection/request

The socket is bound before the model starts loading, so a port in use stops
the process at once (exit 1) instead of after a load; before that, an
installed hypercorn without the internals listen.py builds on stops it too.
listen.py is imported only after that check (its imports are part of it).

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

import trio
from hypercorn.config import Config as HypercornConfig

from .. import logging_setup, memory_fit
from ..bridge import Bridge, engine_loop, follow
from ..config import ServerConfig
from ..engine.preflight import (checkpoint_problem, distributed_problem, input_modalities,
                                join_world, mlx_lm_problem, world)
from .request import grammar_fields as server_grammar
from .http import hypercorn_internals
from .http.app_shell import MAX_HEAD_BYTES
from .app import create_app
from .process import warn_open_cors, watch_signals
from .load_choices import choices_line
from . import drain

log = logging.getLogger("mlxcel.server")

GRACE_S = 5.0
KEEP_ALIVE_S = 5.0        # upstream's (cpp-httplib's) keep-alive; also bounds a request head


def model_name(config: ServerConfig) -> str:
    """The served model name (/v1/models id, every response's `model`), as
    upstream's: the first alias if given; else the --hf-repo or -m value as
    written on the command line (a path stays the path typed, relative or
    not)."""
    if config.model_alias:
        return config.model_alias
    return config.model_ref or config.model


class Lifecycle:
    """Lifecycle lines on stdout (tests and operators wait for these),
    whatever the log configuration; copied into the log when it goes to a
    file."""

    def __init__(self, to_file: bool) -> None:
        self.to_file = to_file

    def say(self, line: str) -> None:
        print(line, flush=True)
        if self.to_file:
            log.info("%s", line)


PARENT_POLL_S = 1.0


async def _watch_launcher(parent: int, shutdown: trio.Event) -> None:
    """Rank 0 of several: mlx.launch does not pass a SIGTERM it receives on to
    the ranks, so when it is gone (our parent changed) the server stops, and
    with it every rank (its Shutdown is the followers' last record)."""
    while os.getppid() == parent:
        await trio.sleep(PARENT_POLL_S)
    log.info("the launcher (pid %d) is gone, shutting down", parent)
    shutdown.set()


async def _watch_load(bridge: Bridge, shutdown: trio.Event, status: dict,
                      lifecycle: Lifecycle) -> None:
    await bridge.loaded.wait()
    if bridge.load_error:
        print(f"error: failed to load model '{bridge.config.model}': {bridge.load_error}",
              file=sys.stderr, flush=True)
        status["code"] = 1
        shutdown.set()
    else:
        info = bridge.info
        # the server grammar is compiled once now; a broken one is logged and
        # refused per request
        await trio.to_thread.run_sync(server_grammar.startup, bridge.config, bridge.vocab)
        lifecycle.say(f"main: model loaded ({info.model_type}, {info.dtype}, "
                      f"n_ctx {info.n_ctx}, {info.n_slots} slots of {info.n_ctx_slot})")
        cfg = bridge.config
        # where upstream reports them too: its context setup logs the batch sizes
        log.info("n_ctx_slot = %d, n_batch = %d (prefill chunk), n_ubatch = %d (no MLX "
                 "effect), cont_batching = %s, context_shift = %s, cache_ram = %d MiB%s",
                 info.n_ctx_slot, cfg.batch_size, cfg.ubatch_size,
                 str(cfg.cont_batching).lower(), str(cfg.context_shift).lower(), cfg.cache_ram,
                 " (sized to this machine)" if cfg.cache_ram_auto else "")
        log.info("initializing, n_slots = %d, n_ctx_slot = %d, kv_unified = '%s'",
                 info.n_slots, info.n_ctx_slot, str(info.kv_unified).lower())
        _say_idle_slots(cfg)
        log.info("%s", choices_line(cfg))


def _say_idle_slots(cfg: ServerConfig) -> None:
    """Upstream's startup account of --cache-idle-slots (the tag is its
    test suite's marker that the feature is on)."""
    if not cfg.cache_idle_slots:
        return
    if cfg.cache_ram == 0:
        log.warning("--cache-idle-slots requires --cache-ram, disabling")
    else:
        log.debug("__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__")


def _hypercorn_config(config: ServerConfig) -> HypercornConfig:
    hc = HypercornConfig()
    hc.read_timeout = None  # listen.serve applies --timeout to reads and writes itself
    hc.keep_alive_timeout = KEEP_ALIVE_S
    # h11 drops an over-long partial head with an empty 431 of its own; give
    # it room beyond our limit so that a head between the two, however TCP
    # splits it, reaches the app's check and its JSON 431.
    hc.h11_max_incomplete_size = 4 * MAX_HEAD_BYTES
    hc.graceful_timeout = GRACE_S
    hc.include_server_header = False
    hc.accesslog = None
    hc.errorlog = logging.getLogger("hypercorn.error")
    hc.alpn_protocols = ["http/1.1"]  # as upstream: no HTTP/2
    if config.ssl_cert_file and config.ssl_key_file:
        hc.certfile, hc.keyfile = config.ssl_cert_file, config.ssl_key_file
    return hc


def _note_ui(config: ServerConfig) -> None:
    if not config.ui:
        log.info("the web UI is disabled (--no-ui); / answers 404, the API is unchanged")


async def _main(config: ServerConfig, sock, lifecycle: Lifecycle,
                distributed: tuple | None = None) -> int:
    status = {"code": 0}
    bridge = Bridge(config, partial(engine_loop, config, distributed=distributed),
                    distributed=distributed is not None)
    app = create_app(bridge, config, model_name(config))
    shutdown = trio.Event()
    # Catch signals before anything starts, so a signal during model load is
    # a graceful shutdown too, never a KeyboardInterrupt traceback.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        return await _serve(config, bridge, app, shutdown, signals, status, sock, lifecycle)


async def _serve(config, bridge, app, shutdown, signals, status, sock,
                 lifecycle: Lifecycle) -> int:
    from .http import listen  # after hypercorn_internals.check(), in run()

    hc = _hypercorn_config(config)
    async with trio.open_nursery() as root:
        root.start_soon(watch_signals, signals, shutdown)
        root.start_soon(drain.drain, app.mlxcel_state, shutdown, GRACE_S)
        if bridge.distributed:
            root.start_soon(_watch_launcher, os.getppid(), shutdown)
        await root.start(bridge.run)
        await root.start(app.mlxcel_state.detached.run)
        await root.start(app.mlxcel_state.streams.run)
        if app.mlxcel_state.watchdog is not None:
            await root.start(app.mlxcel_state.watchdog.run)
        await root.start(app.mlxcel_state.shared.run)
        if app.mlxcel_state.takeover is not None:   # before listening: resumable at once
            await root.start(app.mlxcel_state.takeover.run)
        async with trio.open_nursery() as http:
            await http.start(partial(listen.serve, app, hc, [sock], write_timeout=config.timeout,
                                     # one second later than Quart's body timeout, so a
                                     # silent body gets its 408 before the socket closes
                                     read_timeout=config.timeout + 1,
                                     shutdown_trigger=shutdown.wait))
            address = listen.listening_address(sock, hc.ssl_enabled)
            lifecycle.say(f"main: server is listening on {address}")
            warn_open_cors(config)
            _note_ui(config)
            root.start_soon(_watch_load, bridge, shutdown, status, lifecycle)
        if app.mlxcel_state.takeover is not None:   # before the store's writer stops
            await app.mlxcel_state.takeover.hand_off()
        root.cancel_scope.cancel()
    return status["code"]


def run(config: ServerConfig) -> int:
    try:
        hypercorn_internals.check()
    except hypercorn_internals.HypercornUnsupported as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    problem = None if config.router else mlx_lm_problem()  # a router loads no model itself
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr, flush=True)
        return 1
    from .http import listen  # its hypercorn imports are covered by the check

    try:
        sinks = logging_setup.install(logging_setup.LogPlan(
            disabled=config.log_disable, file=config.log_file, threshold=config.log_verbosity,
            verbose=config.verbose, colors=config.log_colors, prefix=config.log_prefix,
            timestamps=config.log_timestamps, secrets=(*config.secrets, *config.api_keys)))
    except logging_setup.LogFileError as exc:
        print(f"error: --log-file {config.log_file!r}: {exc}", file=sys.stderr, flush=True)
        return 1
    lifecycle = Lifecycle(sinks.to_file)
    if config.aip_replaced_port is not None:
        log.warning("Google Cloud Platform compat: overriding server port %d with AIP_HTTP_PORT %d",
                    config.aip_replaced_port, config.port)
    if config.no_effect:  # copied llama-server tuning flags: accepted, said once
        log.warning("has no effect on MLX: %s", ", ".join(config.no_effect))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    problem = None if config.router else checkpoint_problem(config)
    fit = memory_fit.size(config)  # an unset --cache-ram follows the machine
    config, problem = fit.config, problem or fit.problem
    if problem is None and fit.summary:
        log.info("%s", fit.summary)
    if problem is None and fit.warning:
        log.warning("%s", fit.warning)
    if problem is not None:  # before the socket listens and before any weight is read
        print(f"error: failed to load model '{config.model}': {problem}", file=sys.stderr,
              flush=True)
        sinks.close()
        return 1
    ranks = world()
    distributed = None
    if ranks.distributed:  # started by mlx.launch: one model across its processes
        problem, split_kind = distributed_problem(config, ranks)
        if problem is not None:
            print(f"error: {problem}", file=sys.stderr, flush=True)
            sinks.close()
            return 1
        log.info("rank %d of %d: joining the other processes (%s split)", ranks.rank,
                 ranks.size, split_kind)
        try:
            distributed = join_world(ranks, split_kind)
        except RuntimeError as exc:  # no backend for this launch, or a rank count that differs
            print(f"error: mx.distributed: {exc}", file=sys.stderr, flush=True)
            sinks.close()
            return 1
        if not ranks.leader:  # the engine alone, no socket: rank 0 serves HTTP
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0's Shutdown stops this one
            code = follow(config, distributed)
            log.info("rank %d: stopped", ranks.rank)
            sinks.close()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)  # as below: MLX must not reach its static destructors
    elif config.split_mode not in (None, "none"):
        log.warning("--split-mode %r has no effect in one process; start the server under "
                    "mlx.launch to split the model across processes", config.split_mode)
    try:
        sock = listen.bind(config.host, config.port, config.reuse_port)
    except listen.BindError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sinks.close()
        return 1
    if config.router:
        from .router.runner import main as router_main

        # the router reads each checkpoint's modalities through the pre-load checks
        code = trio.run(router_main, config, sock, lifecycle, _hypercorn_config(config),
                        input_modalities)
    else:
        code = trio.run(_main, config, sock, lifecycle, distributed)
    # Everything is shut down by now (sockets closed, engine thread joined).
    # Skip interpreter finalization: MLX aborts in its static destructors
    # ("terminate called without an active exception") once a model forward
    # has run on a thread other than the main one (measured with mlx 0.32).
    sinks.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

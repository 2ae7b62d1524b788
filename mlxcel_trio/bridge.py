"""Trio <-> engine thread: the only module that touches both worlds.

Theory of operation: `Bridge.run` starts the engine thread and owns it for
the server's lifetime.  Requests go in as commands on the engine's
thread-safe queue (`post` never blocks).  Each engine step hands ONE
`StepEvents` batch to trio through `TrioToken.run_sync_soon`; `_deliver`
then fans the events out to per-job memory channels with `send_nowait`, so a
slow reader can never stall the engine or the other jobs.

Rules:
- A job's channel is bounded by what the job can produce (one event per
  token of its slot's context plus its prompt-progress events), so
  `send_nowait` cannot overflow for a live job.
- Leaving `Bridge.submit` for any reason (a finished job, an error, a client
  disconnect raising `Cancelled`) posts `Cancel` synchronously unless the job
  already finished: cancellation costs the engine at most the step it is in.

The engine is a parameter: `Bridge(config, engine_factory)` calls the
factory from `run` with the `emit` callback and runs what it returns on the
engine thread.  The server passes one that builds engine/loop.py's
`EngineLoop` (`engine_loop` below, bound by server/runner.py); the fast test
tier passes a scripted fake.
`Engine` below is everything the bridge asks of either.
"""

from __future__ import annotations

import itertools
import logging
import threading
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Iterable, Protocol

import trio

from .config import ServerConfig
from .engine.loop import EngineLoop
from .engine.spec import EngineSpec
from .monitor import Monitor
from .protocol.records import (
    Awake,
    CacheStats,
    Cancel,
    ClearPromptCache,
    EmbedJob,
    Embedded,
    EngineStats,
    Failed,
    Finished,
    ForceEnd,
    Job,
    Loaded,
    LoadFailed,
    MlxMemory,
    ModelInfo,
    Shutdown,
    SlotAction,
    SlotFreed,
    Sleeping,
    SlotTokens,
    StepEvents,
    Submit,
    TokenPiece,
    TranscribeJob,
    Transcribed,
    Wake,
)

log = logging.getLogger("mlxcel.bridge")

SHUTDOWN_GRACE_S = 10.0

Emit = Callable[[StepEvents], None]


class Engine(Protocol):
    """What the bridge needs from an engine, and nothing more.

    `run` is the engine thread's body: it emits `Loaded` (or `LoadFailed`
    and returns) once, then serves commands until `Shutdown`; it never
    raises across the thread boundary.  Every event leaves through the
    `emit` the factory was given, one `StepEvents` per step (its counters
    too, as `EngineStats`).  `post` is thread-safe and never blocks (it is
    called from trio, cancel paths included).  `vocab` is published before
    `Loaded` is emitted and is read-only afterwards."""

    vocab: Any

    def run(self) -> None: ...

    def post(self, command: Any) -> None: ...


# Called once, from `Bridge.run` on the trio thread, with the callback that
# hands a step's events to trio; returns the engine to run on the thread.
EngineFactory = Callable[[Emit], Engine]


class _Group:
    """The jobs of one request sharing one channel; the channel closes when
    the last of them ends (finished, failed or cancelled)."""

    __slots__ = ("send", "live")

    def __init__(self, send: trio.MemorySendChannel, job_ids) -> None:
        self.send = send
        self.live = set(job_ids)

    def end(self, job_id: int) -> None:
        self.live.discard(job_id)
        if not self.live:
            self.send.close()


class JobHandle:
    """The jobs of one request: one event channel for all of them (events
    carry their job_id), and an idempotent, synchronous, never-blocking
    `close()` that cancels every job that has not ended yet."""

    def __init__(self, bridge: "Bridge", job_ids: tuple[int, ...],
                 events: trio.MemoryReceiveChannel) -> None:
        self._bridge = bridge
        self.job_ids = job_ids
        self.events = events

    def live(self) -> bool:
        """Whether any of the jobs is still running (not finished, failed or
        cancelled)."""
        return any(job_id in self._bridge._streams for job_id in self.job_ids)

    def close(self) -> None:
        for job_id in self.job_ids:
            self._bridge._forget(job_id)
        self.events.close()


def engine_loop(cfg: ServerConfig, emit: Emit, distributed: tuple | None = None) -> Engine:
    """The real engine for `cfg`: the runner's engine factory, bound to the
    config with `partial`.  Building it loads nothing; its thread does.  It
    lives here because the bridge is the one module that builds the engine.
    `distributed`: (lockstep, split kind) when mlx.launch started several
    ranks (engine/preflight.py's `join_world`)."""
    lockstep, split_kind = distributed or (None, None)
    return EngineLoop(EngineSpec.from_config(cfg), emit, lockstep=lockstep,
                      split_kind=split_kind)


def follow(cfg: ServerConfig, distributed: tuple) -> int:
    """A rank other than 0: the engine alone, on this thread, stepping with
    rank 0 until its Shutdown; no HTTP, no trio.  Returns the exit code."""
    failed: list[str] = []

    def emit(batch: StepEvents) -> None:  # a follower's events go nowhere
        failed.extend(ev.message for ev in batch.events if isinstance(ev, LoadFailed))

    try:
        engine_loop(cfg, emit, distributed).run()
    except Exception as exc:  # a lost peer, a divergence, a failed step: this rank is done
        log.error("this rank stops: %s: %s", type(exc).__name__, exc)
        return 1
    return 1 if failed else 0


class Bridge:
    def __init__(self, config: ServerConfig, engine_factory: EngineFactory,
                 distributed: bool = False) -> None:
        self.config = config
        self.distributed = distributed  # rank 0 of several (mlx.launch)
        self._engine_factory = engine_factory
        self.info: ModelInfo | None = None
        self.vocab = None
        self.embed_vocab = None   # the encoders' tokenizers, when the engine serves them
        self.rerank_vocab = None
        self.load_error: str | None = None
        self.loaded = trio.Event()
        self.monitor = Monitor(config.slots)
        self._ids = itertools.count(1)
        self._streams: dict[int, _Group] = {}
        self._engine: Engine | None = None
        self.cache_stats: CacheStats | None = None  # latest prompt-cache occupancy
        # ... as it stood when the engine fell asleep (/metrics answers from it then)
        self.cache_stats_before_sleep: CacheStats | None = None

    # -- lifetime ------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        token = trio.lowlevel.current_trio_token()

        def emit(batch: StepEvents) -> None:  # engine thread
            try:
                token.run_sync_soon(self._deliver, batch)
            except trio.RunFinishedError:
                pass

        engine = self._engine_factory(emit)
        self._engine = engine
        thread = threading.Thread(target=engine.run, name="mlx-engine", daemon=True)
        thread.start()
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            engine.post(Shutdown())
            with trio.CancelScope(shield=True), trio.move_on_after(SHUTDOWN_GRACE_S):
                await trio.to_thread.run_sync(thread.join, abandon_on_cancel=True)

    @property
    def ready(self) -> bool:
        return self.info is not None

    @property
    def sleeping(self) -> bool:
        return self.monitor.sleeping

    def next_job_id(self) -> int:
        return next(self._ids)

    # -- requests ------------------------------------------------------------------

    def open(self, *jobs: Job) -> JobHandle:
        """Submit `jobs`; whoever holds the handle must `close()` it (the
        server ties it to its request or to detached work)."""
        assert self._engine is not None and self.info is not None
        # an embedding job produces one event (its result or its failure); a
        # transcription at most one piece per token, then its result
        bound = sum(2 if isinstance(job, EmbedJob)
                    else self.info.transcriber.max_tokens + 4
                    if isinstance(job, TranscribeJob) and self.info.transcriber is not None
                    else 2 * self.info.n_ctx_slot + 16 for job in jobs)
        send, recv = trio.open_memory_channel(bound)
        group = _Group(send, (job.id for job in jobs))
        for job in jobs:
            self._streams[job.id] = group
            if not isinstance(job, (EmbedJob, TranscribeJob)):
                self.monitor.submitted(job)
            self._engine.post(Submit(job))
        return JobHandle(self, tuple(job.id for job in jobs), recv)

    @asynccontextmanager
    async def submit(self, *jobs: Job) -> AsyncIterator[trio.MemoryReceiveChannel]:
        handle = self.open(*jobs)
        try:
            yield handle.events
        finally:
            handle.close()

    async def slot_action(self, id_slot: int, tokens: tuple[int, ...] | None,
                          cache_ns: str | None = None):
        """Read (tokens None) or replace a slot's token stream in the engine;
        the answer is a SlotTokens or a Failed."""
        return await self._ask(lambda job_id: SlotAction(job_id, id_slot, tokens, cache_ns))

    async def wake(self) -> Failed | None:
        """Wait until the engine has the model loaded, reloading it if it
        sleeps (a route that reads the model's context, as upstream's wait);
        at once when awake.  A failed reload is the Failed it answers."""
        if not self.sleeping:
            return None
        ev = await self._ask(Wake)
        return ev if isinstance(ev, Failed) else None

    async def _ask(self, command: Callable[[int], object]):
        """Post the command built for a new job id; its one answering event."""
        assert self._engine is not None
        job_id = self.next_job_id()
        send, recv = trio.open_memory_channel(1)
        self._streams[job_id] = _Group(send, (job_id,))
        self._engine.post(command(job_id))
        try:
            async with recv:
                return await recv.receive()
        finally:
            self._streams.pop(job_id, None)

    def force_end(self, job_ids: Iterable[int]) -> None:
        """Realtime reasoning control: the jobs close their thinking block
        before their next draw (POST /v1/chat/completions/control).  Never
        blocks; jobs that already ended are ignored by the engine."""
        if self._engine is not None:
            self._engine.post(ForceEnd(tuple(job_ids)))

    def clear_prompt_cache(self) -> None:
        """Drop the engine's prompt cache (before idling, for instance)."""
        if self._engine is not None:
            self._engine.post(ClearPromptCache())

    def fail_all(self, kind: str, message: str) -> int:
        """Shutdown's last word (server/drain.py): every running job's stream
        gets Failed(kind, message) as its final event and the job is
        cancelled; returns how many there were."""
        ended = 0
        for job_id, group in list(self._streams.items()):
            try:
                group.send.send_nowait(Failed(job_id, kind, message))
            except (trio.WouldBlock, trio.BrokenResourceError):
                pass
            self._forget(job_id)
            ended += 1
        return ended

    def _forget(self, job_id: int) -> None:
        group = self._streams.pop(job_id, None)
        self.monitor.dropped(job_id)
        if group is not None:  # still running: cancel it before its next step
            self._engine.post(Cancel(job_id))
            group.end(job_id)

    # -- engine events (trio thread) -------------------------------------------------

    def _deliver(self, batch: StepEvents) -> None:
        streams = self._streams
        observe = self.monitor.observe
        for ev in batch.events:
            observe(ev)
            job_id = getattr(ev, "job_id", None)
            if not isinstance(ev, (TokenPiece, EngineStats, MlxMemory)):  # per step: not logged
                log.debug("event %s", ev)
            if isinstance(ev, (SlotFreed, EngineStats, MlxMemory)):  # the monitor's alone
                continue
            elif isinstance(ev, Loaded):
                self.info, self.vocab = ev.info, self._engine.vocab
                self.embed_vocab = getattr(self._engine, "embed_vocab", None)
                self.rerank_vocab = getattr(self._engine, "rerank_vocab", None)
                self.loaded.set()
                continue
            elif isinstance(ev, CacheStats):
                self.cache_stats = ev
                continue
            elif isinstance(ev, Sleeping):
                # the prompt cache went with the scheduler; a wake starts a new one
                self.cache_stats_before_sleep, self.cache_stats = self.cache_stats, None
                continue
            elif isinstance(ev, LoadFailed):
                self.load_error = ev.message
                self.loaded.set()
                continue
            group = streams.get(job_id)
            if group is None:
                continue  # the request is gone; its Cancel is already queued
            try:
                group.send.send_nowait(ev)
            except (trio.WouldBlock, trio.BrokenResourceError):
                log.warning("job %s: dropping its stream (reader gone or over bound)", job_id)
                for other in tuple(group.live):
                    self._forget(other)
                continue
            if isinstance(ev, (Finished, Failed, SlotTokens, Awake, Embedded, Transcribed)):
                streams.pop(job_id, None)
                group.end(job_id)

"""The MLX engine thread: load, warm up, then step forever.

This is the only place MLX runs.  Commands arrive on a thread-safe queue
(`post`); everything one step produced leaves through `emit` as a single
`StepEvents` batch.  The loop blocks on the queue only while it has no work,
and drains it without blocking before every step, so a `Cancel` lands before
the next forward pass.  A step or a command that throws fails
the jobs in flight (and the command's own), never the thread: a dead
engine thread would leave every request waiting.  Nothing here imports trio.

The loop is built from one frozen `EngineSpec` (engine/spec.py).  Its rooms:
loading.py loads the model and every side part, idle_sleep.py drops and
reloads it, lockstep_runner.py keeps several ranks in step; the checks asked
before anything loads are preflight.py's.  This module is the serve loop.

Idle sleep (--sleep-idle-seconds): the idle arm's blocking `get` takes the
window as its timeout.  Its expiry is the decision to sleep, taken by the one
thread that knows nothing is admitted or queued, so no request can be caught
half-served and there is no race with a submit in flight (a submit that
lands first simply resets the wait).  Sleeping drops the scheduler (its
generator, KV caches and any prompt cache it holds) and with it the model,
then returns MLX's buffer cache to the system; the tokenizer (`vocab`) stays.
The thread then parks on the same queue: the next `Submit` reloads the
weights and is served by the new scheduler, so waking is that request's own
latency.  `n_decode` / `n_busy_slots` live here, not in the scheduler, so the
/metrics counters survive a sleep; they reach trio only as the `EngineStats`
event closing each step that computed, never by a read across threads.
MLX's allocator figures (live arrays, buffer cache, peak) leave the same way,
as an `MlxMemory` at most once a second while the loop computes and once
each time it goes idle (three counter reads; see `mlx_memory`).

Memory release (engine/memory_release.py): each time the loop goes idle,
and between steps at most every BUSY_EVERY_S while it computes, MLX's
buffer cache is emptied and the C heap's free pages are handed back, so
resident memory follows what is live rather than what fragmentation keeps.

Encoders (engine/embedder.py): an `EmbedJob` goes to the engine's embedder
or reranker (by its pooling), whose queue the loop drains one batched chunk
per encoder between two scheduler steps, so a chat stream waits at most one
chunk; a `Cancel` drops a still-queued one.  With an encoder as -m
(--embeddings / --reranking) the scheduler is `NoChat`, which never has
work, and idle sleep is off.

Speech to text (engine/stt/): with a Whisper checkpoint as -m the engine
serves `TranscribeJob`s alone, the same way: its transcriber is one more
side worker the loop steps between scheduler steps (a few tokens per step),
the scheduler is `NoChat` and idle sleep is off.
"""

from __future__ import annotations

import logging
import queue
import time
from pathlib import Path
from typing import Callable

from ..protocol.records import (
    Awake,
    Cancel,
    ClearPromptCache,
    EmbedJob,
    EngineStats,
    Failed,
    Finished,
    ForceEnd,
    LoadFailed,
    MlxMemory,
    Shutdown,
    SlotAction,
    SlotTokens,
    StepEvents,
    Submit,
    TranscribeJob,
    Wake,
)
from .idle_sleep import IdleSleep, job_of, resident_bytes
from .loading import Loading
from .memory_release import Release
from .lockstep_runner import LockstepRunner
from .spec import EngineSpec

log = logging.getLogger("mlxcel.engine")

# A burst of requests reaches an idle engine a few milliseconds apart (each
# is parsed and tokenized on its own): the first job waits until no other
# arrives for BURST_GAP_S (at most BURST_MAX_S), so the burst is prefilled
# as one batch instead of the first alone and the rest after it.
BURST_GAP_S = 0.001
BURST_MAX_S = 0.010

# MLX's allocator figures leave at most this often while the loop computes,
# and whenever it goes idle.
MEMORY_EVERY_S = 1.0


def mlx_memory(release: Release) -> MlxMemory:
    """MLX's allocator as it stands (counters it keeps, so the read costs
    three calls, about a microsecond, not a walk of its buffers) and the
    releases' totals."""
    import mlx.core as mx

    return MlxMemory(mx.get_active_memory(), mx.get_cache_memory(), mx.get_peak_memory(),
                     release.count, release.seconds, release.released)


class EngineLoop(Loading, IdleSleep, LockstepRunner):
    """The engine thread: `Loading` loads what `spec` names, the serve loop
    below steps it, `IdleSleep` drops and reloads the model, `LockstepRunner`
    keeps several ranks in step."""

    def __init__(self, spec: EngineSpec, emit: Callable[[StepEvents], None], *,
                 lockstep=None, split_kind: str | None = None) -> None:
        self.spec = spec
        self._path = Path(spec.model_path)
        # several ranks, one model (engine/distributed.py): the per-step
        # channel, and how the model is split (tensor | pipeline)
        self._lockstep = lockstep
        self._split_kind = split_kind
        # The encoder side: -m itself (spec.encoder_only names its role, "embed"
        # or "rank"), or models beside the chat one (--embedding-model,
        # --reranker-model).  Each role is one Embedder; a job goes to the
        # "rank" one when its pooling is rank, else to the "embed" one.
        self._encoder_paths = {"embed": spec.embedding_model, "rank": spec.reranker_model}
        if spec.encoder_only is not None:
            self._encoder_paths[spec.encoder_only] = str(spec.model_path)
        self.embedders: dict = {}        # role -> engine/embedder.py's Embedder, once loaded
        self.transcriber = None          # engine/stt's Transcriber when -m is a Whisper checkpoint
        self.embed_vocab = None          # the roles' tokenizers; published before Loaded
        self.rerank_vocab = None
        self._weights_note: str | None = None
        self._blas_fitted = False
        self._emit = emit
        self._draft = None       # the draft model (-md), loaded with the target
        self._vision = None      # an integrated VLM's image tower (engine/towers/)
        self._audio = None       # a chat model's audio tower (engine/towers/)
        # None = never sleep (an encoder alone is small and has no chat to drop)
        self._sleep_idle_s = None if spec.encoder_only is not None else spec.sleep_idle_s
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self.vocab = None  # published before Loaded is emitted; read-only after
        self._n_ctx_slot = 0  # set once by _load; a wake reuses it
        self._n_ctx = 0       # the context (unified KV's budget), set with it
        # Cumulative, this thread's own; trio keeps the copy EngineStats carries.
        self.n_decode = 0       # scheduler steps that computed for >= 1 slot
        self.n_busy_slots = 0   # sum over those steps of the slots computed
        self.release = Release()  # the memory releases, and their totals

    def post(self, command) -> None:
        """Thread-safe, never blocks: callable from trio or from a cancel path."""
        self._commands.put(command)

    # -- thread body -------------------------------------------------------------

    def run(self) -> None:
        try:
            scheduler = self._load()
        except Exception as exc:  # reported to trio, never raised across threads
            # one line; the traceback only with -v (it is ours, not the operator's)
            log.error("model load failed: %s: %s", type(exc).__name__, exc,
                      exc_info=log.isEnabledFor(logging.DEBUG))
            self._emit(StepEvents((LoadFailed(f"{type(exc).__name__}: {exc}"),)))
            return
        # _serve must hold the only reference (an idle sleep drops it to free
        # the model), so this frame hands it over in a box and keeps none
        box = [scheduler]
        del scheduler
        self._serve(box)

    def _serve(self, box: list) -> None:
        scheduler = box.pop()
        lockstep = self._lockstep
        if lockstep is not None and not lockstep.leader:
            return self._follow(scheduler, lockstep)
        commands = self._commands
        # the side workers: encoders and the transcriber, stepped between scheduler steps
        embedders = tuple(self.embedders.values()) + (
            (self.transcriber,) if self.transcriber is not None else ())
        last: list = []   # the previous step's events (a lockstep record's digest)
        release = self.release
        memory_at = time.perf_counter()  # when MLX's figures last left
        while True:
            out: list = []
            taken: list = []  # the commands applied before this step, in order
            block = not scheduler.busy and not any(e.pending for e in embedders)
            if block:  # going idle: give back what the work freed, then say so
                release()
                self._emit(StepEvents((mlx_memory(release),)))
            burst_end = None  # set when an idle engine takes a job: wait for its companions
            while True:
                try:
                    if block:
                        cmd = commands.get(timeout=self._sleep_idle_s)
                    elif burst_end is not None and (left := burst_end - time.perf_counter()) > 0:
                        cmd = commands.get(timeout=min(BURST_GAP_S, left))
                    else:
                        cmd = commands.get_nowait()
                except queue.Empty:
                    if not block:
                        break
                    # the idle window passed with nothing admitted or queued
                    before = resident_bytes()
                    scheduler = None  # the last reference: the model goes with it
                    scheduler, cmd = self._sleep(before)
                    if scheduler is None:  # Shutdown while asleep
                        return
                if block and isinstance(cmd, Submit):
                    burst_end = time.perf_counter() + BURST_MAX_S
                block = False
                if isinstance(cmd, Shutdown):
                    if lockstep is not None:
                        self._lead(lockstep, [*taken, cmd], last, scheduler, out)
                    scheduler.close(out)
                    if out:
                        self._emit(StepEvents(tuple(out)))
                    return
                taken.append(cmd)
                self._apply_or_fail(scheduler, embedders, cmd, out)
            if lockstep is not None and not self._lead(lockstep, taken, last, scheduler, out):
                return
            n_active = scheduler.n_active
            if n_active:
                self.n_decode += 1
                self.n_busy_slots += n_active
            try:
                scheduler.step(out)
            except Exception as exc:
                # Fail the jobs in flight, never the server: the next request
                # starts from a fresh batch.
                log.exception("engine step failed")
                scheduler.fail_all(out, f"{type(exc).__name__}: {exc}")
                if lockstep is not None:  # the ranks may no longer agree: stop them all
                    self._stop_world(out)
                    return
            if n_active:
                # one small record per computing step, in the hop its events take
                out.append(EngineStats(self.n_decode, self.n_busy_slots))
                if (now := time.perf_counter()) - memory_at >= MEMORY_EVERY_S:
                    if release.due(now):
                        release()
                    out.append(mlx_memory(release))
                    memory_at = now
            for embedder in embedders:
                if embedder.pending:
                    # one chunk between two scheduler steps: decode waits at most this long
                    embedder.step(out)
            if out:
                self._emit(StepEvents(tuple(out)))
            last = out

    def _apply_or_fail(self, scheduler, embedders, cmd, out: list) -> None:
        """`_apply`, where a command that raises fails its job and the
        admitted ones instead of the thread: an exception that ended it would
        leave every request waiting forever."""
        try:
            self._apply(scheduler, embedders, cmd, out)
        except Exception as exc:
            log.exception("engine command failed")
            self._command_failed(scheduler, cmd, out, f"{type(exc).__name__}: {exc}")

    def _apply(self, scheduler, embedders, cmd, out: list) -> None:
        """One command, as the scheduler (or an encoder) takes it."""
        if isinstance(cmd, Submit) and isinstance(cmd.job, EmbedJob):
            self._submit_embed(cmd.job, out)
        elif isinstance(cmd, Submit) and isinstance(cmd.job, TranscribeJob):
            self._submit_transcribe(cmd.job, out)
        elif isinstance(cmd, Submit):
            scheduler.submit(cmd.job, out)
        elif isinstance(cmd, Cancel):
            if not any(e.cancel(cmd.job_id) for e in embedders):
                scheduler.cancel(cmd.job_id, out)
        elif isinstance(cmd, ForceEnd):
            scheduler.force_end(cmd.job_ids)
        elif isinstance(cmd, SlotAction):
            scheduler.slot_action(cmd, out)
        elif isinstance(cmd, ClearPromptCache):
            scheduler.clear_prompt_cache(out)
        elif isinstance(cmd, Wake):  # awake by now (a sleeping engine reloaded for it)
            out.append(Awake(cmd.job_id))

    def _submit_embed(self, job: EmbedJob, out: list) -> None:
        rank = job.pooling == "rank"
        embedder = self.embedders.get("rank" if rank else "embed")
        if embedder is None:
            out.append(Failed.coded(job.id, "no_reranking" if rank else "no_embeddings"))
        else:
            embedder.submit(job, out)

    def _submit_transcribe(self, job: TranscribeJob, out: list) -> None:
        if self.transcriber is None:
            out.append(Failed.coded(job.id, "no_audio_model"))
        else:
            self.transcriber.submit(job, out)

    @staticmethod
    def _command_failed(scheduler, cmd, out: list, message: str) -> None:
        """The admitted jobs fail (the generator may be half-updated) and so
        does the command's own job, whose request is waiting for an answer."""
        scheduler.fail_all(out, message)
        job_id = job_of(cmd)
        answered = any(isinstance(ev, (Failed, Finished, SlotTokens, Awake))
                       and ev.job_id == job_id
                       for ev in out)
        if job_id is not None and not answered:
            out.append(Failed(job_id, "server_error", message))

"""Idle sleep (--sleep-idle-seconds): the engine loop's drop and reload.

The serve loop decides to sleep (its idle wait timed out with nothing
admitted or queued) and drops its scheduler; `_sleep` frees what the model
held, serves the encoders while parked, and `_wake` reloads for the command
that needs the model (engine/loop.py's docstring tells the whole story).
"""

from __future__ import annotations

import logging
import os
import queue
import time

from ..protocol.records import (
    Cancel,
    EmbedJob,
    Failed,
    Shutdown,
    Sleeping,
    SlotAction,
    StepEvents,
    Submit,
    Wake,
    Woke,
)

log = logging.getLogger("mlxcel.engine")


def job_of(cmd) -> int | None:
    """The job a command answers to: a Submit's job, a SlotAction's or a
    Wake's reply."""
    if isinstance(cmd, Submit):
        return cmd.job.id
    return cmd.job_id if isinstance(cmd, (SlotAction, Wake)) else None


def resident_bytes() -> int:
    """The process's resident memory where the OS reports it (Linux), else
    what MLX's allocator holds (safetensors weights may be file-backed pages
    MLX does not count, so RSS is the better measure where there is one)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import mlx.core as mx

        return mx.get_active_memory() + mx.get_cache_memory()


class IdleSleep:
    """The idle-sleep methods of `EngineLoop`."""

    def _sleep(self, before: int):
        """Free the model's memory (the caller dropped the scheduler), then
        park until a command that needs the model: a Submit, a SlotAction or
        a Wake (reload; returns the new scheduler and that command), or Shutdown
        (returns None and it).  A Cancel or a ForceEnd names a job that already
        ended and a ClearPromptCache finds the cache already gone: all are
        dropped.  The encoders stay loaded: embedding and rerank jobs are
        served while asleep, one chunk per encoder between two reads of the
        queue (a Cancel then drops a still-queued one), without waking the
        chat model; jobs still queued when a wake comes go on after it."""
        import gc

        self._draft = None  # the draft model sleeps with the target
        gc.collect()  # the model graph may hold reference cycles
        self.release()  # MLX's buffer cache, then the C heap's free pages
        released = before - resident_bytes()
        log.info("server is entering sleeping state (released %.1f MiB)", released / 2**20)
        self._emit(StepEvents((Sleeping(released),)))
        embedders = tuple(self.embedders.values())
        while True:
            try:
                if any(e.pending for e in embedders):
                    cmd = self._commands.get_nowait()
                else:
                    cmd = self._commands.get()
            except queue.Empty:  # embedding work and nothing else to read
                out: list = []
                for embedder in embedders:
                    if embedder.pending:
                        embedder.step(out)
                if out:
                    self._emit(StepEvents(tuple(out)))
                continue
            if isinstance(cmd, Shutdown):
                return None, cmd
            if isinstance(cmd, Submit) and isinstance(cmd.job, EmbedJob):
                out = []
                self._submit_embed(cmd.job, out)
                if out:
                    self._emit(StepEvents(tuple(out)))
                continue
            if isinstance(cmd, Cancel):
                for embedder in embedders:
                    embedder.cancel(cmd.job_id)
                continue
            if not isinstance(cmd, (Submit, SlotAction, Wake)):
                continue
            try:
                return self._wake(), cmd
            except Exception as exc:  # stay asleep; this request fails, not the server
                log.exception("reloading the model failed")
                self._emit(StepEvents((Failed(job_of(cmd), "server_error",
                                              f"{type(exc).__name__}: {exc}"),)))

    def _wake(self):
        t0 = time.perf_counter()
        model, _ = self._load_model()
        self._draft = self._asked_draft()
        scheduler = self._new_scheduler(model)
        load_ms = (time.perf_counter() - t0) * 1e3
        log.info("server is exiting sleeping state (model reloaded in %.0f ms)", load_ms)
        self._emit(StepEvents((Woke(load_ms),)))
        return scheduler

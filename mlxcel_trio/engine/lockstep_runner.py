"""The distributed lockstep runner: the engine loop's side of several ranks.

Rank 0 sends each step's record before it steps (`_lead`); every other rank
applies rank 0's commands and steps the same batch (`_follow`).  A rank that
loses its peers stops the process as SIGTERM does.  The record itself, the
split and the collectives are engine/distributed.py's.
"""

from __future__ import annotations

import logging
import os

from ..protocol.records import Shutdown, StepEvents

log = logging.getLogger("mlxcel.engine")


class LockstepRunner:
    """The lockstep methods of `EngineLoop`."""

    def _lead(self, lockstep, taken: list, last: list, scheduler, out: list) -> bool:
        """Rank 0: send this step's record; False once the other ranks are
        gone (every job in flight fails and the server stops)."""
        from .distributed import DistributedError

        try:
            lockstep.lead(taken, last)
            return True
        except DistributedError as exc:
            log.error("distributed: %s; stopping", exc)
            scheduler.fail_all(out, f"the other ranks stopped: {exc}")
            self._stop_world(out)
            return False

    def _stop_world(self, out: list) -> None:
        """The process stops as on SIGTERM (HTTP answers what it holds)."""
        import signal

        if out:
            self._emit(StepEvents(tuple(out)))
        os.kill(os.getpid(), signal.SIGTERM)

    def _follow(self, scheduler, lockstep) -> None:
        """A follower: rank 0's commands, then the same step; its own events
        go nowhere.  Any failure ends the process (mlx.launch then stops the
        other ranks): a follower that missed a step cannot rejoin."""
        last: list = []
        while True:
            out: list = []
            for cmd in lockstep.follow(last):
                if isinstance(cmd, Shutdown):
                    scheduler.close(out)
                    return
                # as rank 0 took it: a command that failed there fails here too,
                # and the schedulers stay the same
                self._apply_or_fail(scheduler, (), cmd, out)
            scheduler.step(out)
            last = out

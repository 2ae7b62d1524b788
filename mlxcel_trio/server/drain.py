"""SIGTERM's drain: what a client sees while the server stops.

From the signal on, a request that reaches the app (on a connection that
was already open) is answered 503 "the server is shutting down"; requests
in flight go on.  Just before the grace runs out (hypercorn then cuts every
connection), each job still running fails with the same message, so a
stream ends with a final SSE error frame the client can read instead of a
bare cut, and a non-streamed request answers 503.
"""

from __future__ import annotations

import logging

import trio

log = logging.getLogger("mlxcel.server")

MESSAGE = "the server is shutting down"
ENDING_MARGIN_S = 1.0   # before the grace ends: time for the final frames to go out


async def drain(state, shutdown: trio.Event, grace_s: float) -> None:
    """Wait for `shutdown`, mark `state` draining, then end what still runs."""
    await shutdown.wait()
    state.draining = True
    if state.takeover is not None:   # with a session store: a peer continues them
        await state.takeover.hand_off()   # (bounded and shielded; the runner repeats it)
    await trio.sleep(max(grace_s - ENDING_MARGIN_S, 0.0))
    ended = state.bridge.fail_all("unavailable_error", MESSAGE)
    if ended:
        log.info("shutdown: %d job(s) still running after the grace ended with an error", ended)

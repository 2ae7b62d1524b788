"""What the request code needs from the running server (`Served`), and the
one way CPU-heavy request work leaves the event loop (`off_loop`).

Its own module so that request/jobs.py and request/media_input.py (which
decodes media off the loop) both build on it without importing each other.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import attrs
import cattrs
import trio

from ...bridge import Bridge
from ...protocol.speculative import SpecSettings
from .schema import NativeRequest, request_converter

if TYPE_CHECKING:
    from ..state import AppState


@attrs.frozen
class Served:
    """What the completion routes need from the running server."""

    bridge: Bridge
    model_name: str
    defaults: NativeRequest           # an empty request under the server's flags / checkpoint
    build_info: str
    n_predict_cap: int = -1           # -n: the limit of a request that sends -1 (or none)
    n_slots: int = 1                  # n_cmpl's upper limit, as upstream's n_parallel
    batch_size: int = 2048            # -b: /infill keeps its context within one batch
    spm_infill: bool = False          # --spm-infill: suffix block first
    # the speculative settings in force (the request's speculative.* fields
    # are inert, as upstream compiles them out)
    speculative: SpecSettings = attrs.field(factory=SpecSettings)
    # structures a body over `defaults`, with the server's limits (built once)
    converter: cattrs.Converter = attrs.field(
        init=False, eq=False, repr=False,
        default=attrs.Factory(lambda self: request_converter(
            self.defaults, {"n_cmpl": (1, self.n_slots)}), takes_self=True))
    # the app's sessions and chat settings (server/state.py)
    state: "AppState" = attrs.field(kw_only=True)


# -- work off the event loop ------------------------------------------------------

T = TypeVar("T")


async def off_loop(served: Served, fn: Callable[..., T], *args: Any) -> T:
    """CPU-heavy request work (tokenizing, chat template rendering) on a
    worker thread, a few at once per app (AppState.heavy_work): a 15 MB
    prompt takes seconds to tokenize, and meanwhile the event loop keeps
    answering /health and feeding every other stream.  (engine/vocab.py
    tokenizes long texts with the GIL released, so the loop really runs.)"""
    return await trio.to_thread.run_sync(partial(fn, *args), limiter=served.state.heavy_work)

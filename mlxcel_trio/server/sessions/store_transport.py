"""The session store's transport: redis-py calls on worker threads, and the
backoff that makes a lost store fail fast (sessions/shared.py tells the whole
story).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import trio

from ..http.errors import ApiError

log = logging.getLogger("mlxcel.session_store")

P = "mlxcel:"
THREADS = 96                  # worker threads for store calls (followers block in one)
BLOCK_MS = 500                # a remote follower's XREAD BLOCK
MAX_BACKOFF_S = 5.0

class StoreDown(Exception):
    """The store did not answer (or is in its backoff)."""


def unavailable(url: str) -> ApiError:
    return ApiError(f"the session store ({url}) is unavailable; resumable streams "
                    "(X-Conversation-Id) and stored responses shared between replicas are "
                    "refused until it returns; retry later, or send the request without "
                    "X-Conversation-Id", "unavailable_error")


def seconds_from_env(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default


class Transport:
    """The store calls of `SharedStore` (its constructor sets the client,
    the limiter and the backoff state)."""

    @property
    def up(self) -> bool:
        return trio.current_time() >= self._down_until

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(redis client, *args) on a worker thread; StoreDown on failure."""
        if not self.up:
            raise StoreDown(self.shown)
        try:
            result = await trio.to_thread.run_sync(fn, self._redis, *args,
                                                   limiter=self._limiter,
                                                   abandon_on_cancel=True)
        except self._refused as exc:   # the store answered: it is up, the command failed
            log.error("session store %s refused a command: %s", self.shown, exc)
            raise StoreDown(self.shown) from None
        except self._errors as exc:
            self._failed(exc)
            raise StoreDown(self.shown) from None
        if self._was_down:
            self._was_down = False
            log.warning("session store %s is back", self.shown)
        self._backoff = 0.0
        return result

    def _failed(self, exc: BaseException) -> None:
        self._backoff = min(MAX_BACKOFF_S, max(0.1, self._backoff * 2))
        self._down_until = trio.current_time() + self._backoff
        if not self._was_down:
            self._was_down = True
            log.warning("session store %s is unavailable (%s): resumable streams are refused "
                        "until it returns", self.shown, type(exc).__name__)

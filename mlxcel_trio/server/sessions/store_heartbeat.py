"""The session store's heartbeat: this replica's liveness key, the ticks and
deferred publications it paces, and whether another replica is alive.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from .store_transport import P, StoreDown

log = logging.getLogger("mlxcel.session_store")

class Heartbeat:
    """The heartbeat methods of `SharedStore`."""

    async def _beat(self) -> None:
        """This replica's heartbeat key, alive for one replica TTL."""
        key, ttl_ms = P + "r:" + self.replica, int(self.replica_ttl_s * 1000)
        await self.call(lambda r: r.set(key, b"1", px=ttl_ms))

    async def _heartbeat(self) -> None:
        while True:   # run() wrote the first beat
            await trio.sleep(min(self.replica_ttl_s / 3, max(self._backoff, 0.1))
                             if self._was_down else self.replica_ttl_s / 3)
            for tick in self._ticks:
                tick()
            if self.up and not self._released:
                try:
                    await self._beat()
                except StoreDown:
                    pass

    async def release(self) -> None:
        """SIGTERM's hand-off: once every queued chunk is written, stop
        beating and remove the heartbeat, so peers take this replica's
        sessions over at their next beat instead of after the TTL."""
        with trio.move_on_after(self.replica_ttl_s):
            await trio.sleep(0.05)   # the producers just cancelled queue their last chunks
            while self._pending or self._flushing:
                await trio.sleep(0.01)
        self._released = True
        key = P + "r:" + self.replica
        try:
            await self.call(lambda r: r.delete(key))
        except StoreDown:
            pass   # the TTL does it

    def on_tick(self, fn: Callable[[], None]) -> None:
        """Call `fn()` at every heartbeat (a third of the replica TTL)."""
        self._ticks.append(fn)

    def defer(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Run `fn()` soon, in order, on the writer, before the chunks queued
        after it (bounded: with 1024 waiting the newest is dropped: these are
        best-effort publications)."""
        try:
            self._deferred_send.send_nowait(fn)
            self._wake.set()
        except trio.WouldBlock:
            log.warning("session store %s: publication queue full", self.shown)

    async def owner_alive(self, replica: str) -> bool:
        if replica == self.replica:
            return True
        return bool(await self.call(lambda r: r.exists(P + "r:" + replica)))

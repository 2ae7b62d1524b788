"""The session store's control bus: ask the replica that owns a session to
act (cancel a stream, force a reasoning end, cancel a background response),
and read this replica's own control stream.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from .store_transport import BLOCK_MS, P, StoreDown

log = logging.getLogger("mlxcel.session_store")

class ControlBus:
    """The control methods of `SharedStore`."""

    def on_control(self, op: str, fn: Callable[[dict[str, str]], None]) -> None:
        self._handlers[op] = fn

    async def send_control(self, replica: str, op: str, **fields: str) -> None:
        key = P + "c:" + replica
        ttl_ms = int(self.replica_ttl_s * 1000) * 3

        def send(r):
            pipe = r.pipeline(transaction=False)
            pipe.xadd(key, {"op": op, **fields}, maxlen=1024, approximate=True)
            pipe.pexpire(key, ttl_ms)
            pipe.execute()
        await self.call(send)

    async def _control_reader(self) -> None:
        key = P + "c:" + self.replica
        last = "0-0"   # the stream is this process's own (a fresh replica id)
        while True:
            if not self.up:
                await trio.sleep(max(self._backoff, 0.1))
                continue
            try:
                got = await self.call(lambda r, at: r.xread({key: at}, count=64, block=BLOCK_MS),
                                      last)
            except StoreDown:
                continue
            for _stream, entries in got or ():
                for entry_id, fields in entries:
                    last = entry_id.decode()
                    msg = {k.decode(): v.decode() for k, v in fields.items()}
                    handler = self._handlers.get(msg.get("op", ""))
                    if handler is not None:
                        try:
                            handler(msg)
                        except Exception:  # one bad message never stops control
                            log.exception("session store control message failed")

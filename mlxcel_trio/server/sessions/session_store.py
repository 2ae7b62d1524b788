"""What the session rooms ask of a session store: `SessionStore`.

streams.py, control.py and response_store.py speak to a store through this
interface alone, and always have one: shared.py's `SharedStore` (Valkey /
Redis), file_store.py's `FileStore` (file://DIR: one server's streams on
local disk) and memory_store.py's `MemoryStore` (no --session-store:
nothing outlives the process) implement it.  What differs between them is
answered by the store (`continues`, and the no-op peer half of the two
that have no peers), never by a test for "no store".

A stream's log also carries what a continuation needs (takeover.py): the
request record given to `open_stream`, and each chunk's token ids given to
`queue`.
Every call may raise store_transport.StoreDown.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from .store_streams import RemoteSession


class SessionStore(Protocol):
    replica: str     # this replica's id in the store
    shown: str       # the store's address as logs and errors show it (no password)
    continues: bool  # its unfinished sessions can be continued by another process:
                     # streams record what that needs, SIGTERM leaves them unfinished

    @property
    def up(self) -> bool: ...

    async def run(self, *, task_status=...) -> None: ...

    # heartbeat: pacing and liveness
    def on_tick(self, fn: Callable[[], None]) -> None: ...

    def defer(self, fn: Callable[[], Awaitable[None]]) -> None: ...

    async def owner_alive(self, replica: str) -> bool: ...

    async def release(self) -> None: ...   # SIGTERM: hand live sessions to peers

    # the control bus
    def on_control(self, op: str, fn: Callable[[dict[str, str]], None]) -> None: ...

    async def send_control(self, replica: str, op: str, **fields: str) -> None: ...

    # the stream log
    async def open_stream(self, scope: int, cid: str, record: dict | None = None
                          ) -> tuple[str, tuple[str, str] | None]: ...

    def queue(self, gen: str, scope: int, cid: str, start: int, data: bytes, *,
              end: bool = False, drop: bool = False,
              then: Callable[[bool], None] | None = None,
              tokens: list[list[int]] | None = None) -> None: ...

    async def describe(self, scope: int, cid: str) -> RemoteSession | None: ...

    async def lookup(self, scope: int, ids: list[str]) -> list[RemoteSession]: ...

    async def first_offset(self, scope: int, session: RemoteSession) -> int: ...

    def follow(self, session: RemoteSession, scope: int, offset: int) -> AsyncIterator[bytes]: ...

    async def delete_stream(self, scope: int, cid: str) -> tuple[str, str] | None: ...

    # controllable completions
    async def register_completion(self, cid: str, scope: str, armed: bool) -> None: ...

    async def drop_completion(self, cid: str) -> None: ...

    async def find_completion(self, cid: str) -> dict | None: ...

    # stored responses
    async def put_response(self, scope: str, rid: str, record: dict) -> None: ...

    async def get_response(self, scope: str, rid: str) -> dict | None: ...

"""Stored responses for /v1/responses: `store`, `previous_response_id`,
GET /v1/responses/:id and POST /v1/responses/:id/cancel.

A response is stored unless the request says `"store": false` (OpenAI's
default is to store).  What is kept per response: the response object as
the client saw it (what GET answers) and the conversation it ends, as chat
messages (every earlier turn of its chain, this request's input without its
`instructions`, then the assistant's reply), which is what a later request
naming it as `previous_response_id` continues from.  `instructions` are not
carried over, as OpenAI documents.

Bounds: at most MAX_RESPONSES responses and MAX_BYTES of serialized JSON in
all.  Eviction is oldest-stored first (insertion order; reading a response
does not refresh it), until the new one fits; a response larger than
MAX_BYTES on its own is not stored.  An in-progress background response
is never evicted, so its task always has its entry to finish (the number of
those is bounded by MAX_BACKGROUND).

Entries are keyed by (scope, id): with several API keys a response stored
under one key is an unknown id under another (server/http/key_scope.py).

With a session store beyond the process (sessions/shared.py's Redis, or
file_store.py's directory) every stored response is also written there, so
`previous_response_id`, GET and cancel work on every replica and after a
restart: `fetch` reads this process's entries first, then the store's;
`keep` writes both.  A background run lives on the replica that runs it: a
cancel through another replica is forwarded to it.  Its run is a stream
session of its own (id SESSION_PREFIX + the response id:
surfaces/responses_background.py), so when that replica dies a live one
(or the restarted server) continues it; meanwhile its entry, read through
any replica, answers the status it was written with ("in_progress") while
the stream registry says the session goes on (`continuing`), else "failed"
with an error saying why (ORPHANED, or the takeover's reason), which a
client can act on (create it again) instead of polling "in_progress"
forever.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, Awaitable, Callable

import attrs

from ..http.errors import dumps
from .memory_store import MemoryStore
from .session_store import SessionStore
from .store_transport import StoreDown, unavailable

log = logging.getLogger("mlxcel.responses")

MAX_RESPONSES = 256
MAX_BYTES = 32 * 1024 * 1024
MAX_BACKGROUND = 64
# what GET answers for a background run whose replica died and that no
# replica continues (see the docstring)
ORPHANED = ("the response's server stopped before it finished, and no server continued "
            "it: create it again")
SESSION_PREFIX = "mlxcel-background-"   # + the response id: a background run's stream session


@attrs.define
class Stored:
    obj: dict[str, Any]                   # the response object GET answers
    history: list[dict]                   # the chain's chat messages, reply included
    background: bool = False
    cancel: Callable[[], None] | None = None   # set while a background run is live
    size: int = 0
    replica: str | None = None            # read from the shared store: the replica that wrote it
    session: str | None = None            # a background run's stream session (its id)

    @property
    def live(self) -> bool:
        return self.obj.get("status") in ("queued", "in_progress")


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES,
                 shared: SessionStore | None = None,
                 continuing: Callable[[int, str], Awaitable[bool]] | None = None) -> None:
        self.shared: SessionStore = shared or MemoryStore()
        # whether a stream session (key scope, id) is live or will be continued
        # (StreamRegistry.continuing; none: a gone replica's run is over)
        self.continuing = continuing
        self.shared.on_control("response_cancel", self._cancel_message)
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, str], Stored] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        return self._bytes

    def get(self, scope: str, rid: str) -> Stored | None:
        return self._items.get((scope, rid))

    def live_background(self) -> int:
        return sum(1 for s in self._items.values() if s.background and s.live)

    def put(self, scope: str, rid: str, stored: Stored) -> bool:
        """Store (or replace) a response; False when it alone exceeds the bound."""
        key = (scope, rid)
        old = self._items.pop(key, None)
        if old is not None:
            self._bytes -= old.size
        stored.size = len(dumps(stored.obj)) + len(dumps(stored.history))
        if stored.size > self.max_bytes:
            return False
        for victim in list(self._items):
            if len(self._items) < self.max_responses and \
                    self._bytes + stored.size <= self.max_bytes:
                break
            if self._items[victim].live:
                continue
            self._bytes -= self._items.pop(victim).size
        self._items[key] = stored
        self._bytes += stored.size
        return True

    # -- with a shared store ---------------------------------------------------------

    async def fetch(self, scope: str, rid: str) -> Stored | None:
        """This process's entry, else the shared store's."""
        local = self.get(scope, rid)
        if local is not None:
            return local
        try:
            record = await self.shared.get_response(scope, rid)
        except StoreDown:
            raise unavailable(self.shared.shown) from None
        if record is None:
            return None
        stored = Stored(record["obj"], record["history"], record.get("background", False),
                        replica=record.get("replica"), session=record.get("session"))
        if stored.live and await self._orphaned(stored) and \
                not await self._goes_on(scope, stored):
            stored.obj = failed(stored.obj, ORPHANED)
        return stored

    async def _goes_on(self, scope: str, stored: Stored) -> bool:
        """A gone replica's background run whose session is continued."""
        if stored.session is None or self.continuing is None:
            return False
        return await self.continuing(int(scope or 0), stored.session)

    def continuation_failed(self, scope: int, cid: str, why: str) -> None:
        """The takeover gave up on a session (takeover.py): when it was a
        background run's, its entry becomes "failed" with the reason."""
        if not cid.startswith(SESSION_PREFIX):
            return
        key, rid = str(scope), cid[len(SESSION_PREFIX):]
        shared = self.shared

        async def write() -> None:
            record = await shared.get_response(key, rid)
            if record is None or record["obj"].get("status") not in ("queued", "in_progress"):
                return
            stored = Stored(failed(record["obj"], why), record["history"], True, session=cid)
            self.put(key, rid, stored)
            await shared.put_response(key, rid, _record(stored))
        shared.defer(write)

    async def _orphaned(self, stored: Stored) -> bool:
        """A live background response whose replica's heartbeat lapsed: its
        run died with that process."""
        if stored.replica in (None, self.shared.replica):
            return False
        try:
            return not await self.shared.owner_alive(stored.replica)
        except StoreDown:
            return False

    async def keep(self, scope: str, rid: str, stored: Stored) -> None:
        """`put`, and write it to the shared store (a failed write is logged:
        the response stays readable on this replica)."""
        self.put(scope, rid, stored)
        if stored.size <= self.max_bytes:
            try:
                await self.shared.put_response(scope, rid, _record(stored))
            except StoreDown:
                log.warning("stored response %s kept on this replica only: the session "
                            "store is unavailable", rid)

    def publish(self, scope: str, rid: str, stored: Stored) -> None:
        """`keep` from synchronous code: the store write is queued ahead of
        every stream chunk queued after it (sessions/shared.py's writer)."""
        self.put(scope, rid, stored)
        shared = self.shared
        if stored.size <= self.max_bytes:
            record = _record(stored)
            shared.defer(lambda: shared.put_response(scope, rid, record))

    async def cancel_remote(self, scope: str, rid: str, stored: Stored) -> bool:
        """Ask the replica running a background response to cancel it."""
        if stored.replica in (None, self.shared.replica):
            return False
        try:
            await self.shared.send_control(stored.replica, "response_cancel", scope=scope,
                                           rid=rid)
        except StoreDown:
            raise unavailable(self.shared.shown) from None
        return True

    def _cancel_message(self, msg: dict[str, str]) -> None:
        stored = self.get(msg.get("scope", ""), msg.get("rid", ""))
        if stored is not None and stored.live and stored.cancel is not None:
            stored.cancel()


def failed(obj: dict[str, Any], why: str) -> dict[str, Any]:
    return {**obj, "status": "failed", "error": {"code": "server_error", "message": why}}


def _record(stored: Stored) -> dict[str, Any]:
    out = {"obj": stored.obj, "history": stored.history, "background": stored.background}
    if stored.session is not None:
        out["session"] = stored.session
    return out

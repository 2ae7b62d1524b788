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
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

import attrs

from ..http.errors import dumps

MAX_RESPONSES = 256
MAX_BYTES = 32 * 1024 * 1024
MAX_BACKGROUND = 64


@attrs.define
class Stored:
    obj: dict[str, Any]                   # the response object GET answers
    history: list[dict]                   # the chain's chat messages, reply included
    background: bool = False
    cancel: Callable[[], None] | None = None   # set while a background run is live
    size: int = 0

    @property
    def live(self) -> bool:
        return self.obj.get("status") in ("queued", "in_progress")


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES) -> None:
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

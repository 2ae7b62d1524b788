"""The session store's records: controllable completions (which replica can
force a completion's reasoning end) and stored responses.
"""

from __future__ import annotations

import json

from .store_transport import P

RESPONSE_TTL_S = 30 * 86400   # OpenAI keeps stored responses 30 days
RESPONSE_TTL_ENV = "MLXCEL_INTERNAL_RESPONSE_TTL_S"     # tests only

class CompletionRecords:
    """The controllable-completion methods of `SharedStore`."""

    async def register_completion(self, cid: str, scope: str, armed: bool) -> None:
        ttl = self.stream_ttl_ms
        await self.call(lambda r: r.set(P + "cc:" + cid, json.dumps(
            {"replica": self.replica, "scope": scope, "armed": armed}), px=ttl))

    async def drop_completion(self, cid: str) -> None:
        await self.call(lambda r: r.delete(P + "cc:" + cid))

    async def find_completion(self, cid: str) -> dict | None:
        raw = await self.call(lambda r: r.get(P + "cc:" + cid))
        return json.loads(raw) if raw else None


class ResponseRecords:
    """The stored-response methods of `SharedStore`."""

    async def put_response(self, scope: str, rid: str, record: dict) -> None:
        data = json.dumps({**record, "replica": self.replica}, separators=(",", ":"))
        ttl = self.response_ttl_ms
        await self.call(lambda r: r.set(f"{P}resp:{scope}:{rid}", data, px=ttl))

    async def get_response(self, scope: str, rid: str) -> dict | None:
        raw = await self.call(lambda r: r.get(f"{P}resp:{scope}:{rid}"))
        return json.loads(raw) if raw else None

"""What a media read may do: the one record every reader takes."""

from __future__ import annotations

import os
import secrets
from typing import Awaitable, Callable, Mapping

import attrs

from .errors import MediaError
from .limits import DEFAULT_MAX_IMAGES, DEFAULT_MAX_PAYLOAD
from .ssrf import IPAddress, allow_private_from_env, is_public

FETCH_TIMEOUT = 10.0                    # seconds for a whole remote fetch, redirects included

# (host, port) -> the addresses a name resolves to
Resolver = Callable[[str, int], Awaitable[list[str]]]


@attrs.frozen
class MediaPolicy:
    """The limits and permissions of media reads.

    `media_path` is the canonical --media-path root (None: file:// refused);
    `max_bytes` bounds one payload, whatever its source; `max_items` the
    media items of one request (--max-images, see `check_count`); `allow_private`
    (MLXCEL_ALLOW_PRIVATE_MEDIA_URLS=1) makes every address check pass;
    `timeout` bounds a whole remote fetch; `marker` is the text a raw
    prompt puts where each multimodal_data item goes (/props reports it).  `address_allowed` and `resolver`
    are seams for tests (a predicate that admits 127.0.0.1 but not
    127.0.0.2, a stub DNS); production uses `ssrf.is_public` and the
    system resolver."""

    media_path: str | None = None
    max_bytes: int = DEFAULT_MAX_PAYLOAD
    max_items: int = DEFAULT_MAX_IMAGES
    allow_private: bool = False
    timeout: float = FETCH_TIMEOUT
    marker: str = "<__media__>"
    address_allowed: Callable[[IPAddress], bool] = is_public
    resolver: Resolver | None = None

    @classmethod
    def from_settings(cls, media_path: str | None, max_bytes: int = DEFAULT_MAX_PAYLOAD,
                      max_items: int = DEFAULT_MAX_IMAGES,
                      env: Mapping[str, str] | None = None) -> "MediaPolicy":
        """The server's policy: --media-path, --max-image-payload-size,
        --max-images, the environment's allow-private switch, and the raw
        prompt's media marker: LLAMA_MEDIA_MARKER when set, else a random
        one per process, as upstream draws it, so no text a client sends
        by accident stands for an image."""
        env = os.environ if env is None else env
        marker = env.get("LLAMA_MEDIA_MARKER") or f"<__media_{secrets.token_hex(16)}__>"
        return cls(media_path=os.path.realpath(media_path) if media_path else None,
                   max_bytes=max_bytes, max_items=max_items,
                   allow_private=allow_private_from_env(env), marker=marker)

    def permits(self, address: IPAddress) -> bool:
        return self.allow_private or self.address_allowed(address)

    def check_count(self, count: int) -> None:
        """Refuse a request carrying more than `max_items` media items
        (call it before reading any of them)."""
        if count > self.max_items:
            raise MediaError(f"the request carries {count} media items; at most "
                             f"{self.max_items} are accepted per request (--max-images)")

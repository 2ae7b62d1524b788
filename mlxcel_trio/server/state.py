"""The app's state: every object that lives as long as one app.

Rule: nothing in server/ keeps state in a module global.  What outlives a
request lives here, built once by `create_app` (server/app.py) and reached
explicitly: handlers through `Served.state` or the handler table, the runner
through `app.mlxcel_state` (it runs the two tasks below in its root nursery).

    detached    the one nursery for work that outlives its request
    streams     X-Conversation-Id sessions (their producers are detached work)
    control     completions POST /v1/chat/completions/control can reach
    responses   stored Responses (background runs are detached work)
    shared      the session store (--session-store): shared with other replicas
                (redis://), or this server's streams on disk (file://), with
                `takeover` continuing what a killed server left; or, without
                the option, the memory store: everything stays in this process
    slot_identities   slot-file identity digests, by model path
    heavy_work  bounds the worker threads tokenizing and rendering requests
    media       what a request's media reference may read (media/policy.py)
    watchdog    reports a request that stopped making progress (http/watchdog.py)
"""

from __future__ import annotations

import attrs
import trio

from ..bridge import Bridge
from ..chat import settings as chat_settings
from ..config import ServerConfig
from ..media import MediaPolicy
from .adapters import AdapterTable
from .. import store_url
from .http.watchdog import RequestWatchdog
from .sessions.control import ControlRegistry
from .sessions.detached import Detached
from .sessions.response_store import ResponseStore
from .sessions.file_store import FileStore
from .sessions.memory_store import MemoryStore
from .sessions.session_store import SessionStore
from .sessions.shared import SharedStore
from .sessions.takeover import Takeover
from .sessions.streams import MAX_BYTES as STREAM_MAX_BYTES
from .sessions.streams import StreamRegistry


@attrs.define(eq=False, repr=False)
class AppState:
    config: ServerConfig
    bridge: Bridge
    detached: Detached
    streams: StreamRegistry
    control: ControlRegistry
    responses: ResponseStore = attrs.field(factory=ResponseStore)
    shared: SessionStore = attrs.field(factory=MemoryStore)
    takeover: Takeover | None = None   # with a store that `continues`: its unfinished streams
    slot_identities: dict[str, dict[str, str]] = attrs.field(factory=dict)
    adapters: AdapterTable = attrs.field(factory=AdapterTable)  # LoRA: paths, global scales
    # Tokenizing and template rendering run on worker threads (request/jobs.py
    # off_loop): two at once, so a flood of huge bodies queues instead of
    # taking every core from the engine thread.
    heavy_work: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(2))
    media: MediaPolicy = attrs.field(factory=MediaPolicy)
    watchdog: RequestWatchdog | None = None
    _chat: chat_settings.ChatSettings | None = None
    draining: bool = False   # SIGTERM received: new requests answer 503 (server/drain.py)

    @classmethod
    def create(cls, config: ServerConfig, bridge: Bridge) -> "AppState":
        detached = Detached()
        if config is None:  # tests pass no config
            media, url = MediaPolicy(), store_url.MEMORY
        else:
            media = MediaPolicy.from_settings(config.media_path, config.max_image_payload_size,
                                              config.max_images)
            url = config.session_store
        shared = session_store(url)
        streams = StreamRegistry.from_env(detached, shared)
        responses = ResponseStore(shared=shared, continuing=streams.continuing)
        takeover = None
        if shared.continues:
            takeover = Takeover(streams, shared, bridge)
            takeover.on_failed = responses.continuation_failed
        return cls(config, bridge, detached, streams,
                   ControlRegistry(bridge, shared), adapters=AdapterTable.from_config(config),
                   responses=responses, shared=shared, media=media,
                   watchdog=(RequestWatchdog(bridge.monitor) if hasattr(bridge, "monitor")
                             else None),
                   takeover=takeover)

    def chat_settings(self) -> chat_settings.ChatSettings:
        """The server's chat settings, built on first use: they need the
        vocabulary, which exists once the model loaded (handlers only run
        after that), and building them logs the template's warnings, which
        belong to the first request that renders a chat."""
        if self._chat is None:
            self._chat = chat_settings.build(self.config, self.bridge.vocab)
        return self._chat


def session_store(url: str) -> SessionStore:
    """--session-store's store: memory (the default), file://DIR or Redis."""
    if url == store_url.MEMORY:
        return MemoryStore()
    if store_url.is_file(url):   # this server's streams on disk; the rest in-process
        return FileStore(url, stream_ttl_s=StreamRegistry.ttl_from_env(),
                         max_bytes=STREAM_MAX_BYTES)
    return SharedStore(url, stream_ttl_s=StreamRegistry.ttl_from_env(),
                       max_bytes=STREAM_MAX_BYTES)

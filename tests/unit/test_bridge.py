"""The bridge's own state, fed engine events by hand."""

from __future__ import annotations

from mlxcel_trio.bridge import Bridge
from mlxcel_trio.config import ServerConfig
from mlxcel_trio.protocol.records import CacheStats, Sleeping, StepEvents
from mlxcel_trio.server.surfaces.info import prompt_cache_props


def test_a_sleep_empties_the_reported_prompt_cache():
    """Sleeping drops the scheduler and its prompt cache with it: /props must
    not keep reporting the entries and bytes of a cache that is gone."""
    bridge = Bridge(ServerConfig(model="x", cache_ram=64))
    bridge._deliver(StepEvents((CacheStats(3, 4096, 4096, 64 << 20, 2, 1),)))
    assert prompt_cache_props(bridge)["bytes"] == 4096
    bridge._deliver(StepEvents((Sleeping(1 << 20),)))
    props = prompt_cache_props(bridge)
    assert props["entries"] == 0 and props["bytes"] == 0
    assert props["enabled"] and props["budget_bytes"] == 64 << 20

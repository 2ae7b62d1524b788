"""The bridge's own state, fed engine events by hand."""

from __future__ import annotations

from mlxcel_trio.bridge import Bridge
from mlxcel_trio.config import ServerConfig
from mlxcel_trio.protocol.records import CacheStats, EngineStats, Sleeping, StepEvents
from mlxcel_trio.server.surfaces.info import prompt_cache_props
from mlxcel_trio.server.surfaces.metrics import _upstream_values


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


def test_metrics_read_the_engine_counters_the_events_carried():
    """n_decode_total and n_busy_slots_per_decode come from the latest
    EngineStats the bridge delivered, never from the engine object."""
    bridge = Bridge(ServerConfig(model="x"))
    assert _upstream_values(bridge)["n_decode_total"] == 0
    bridge._deliver(StepEvents((EngineStats(1, 2),)))
    bridge._deliver(StepEvents((EngineStats(4, 6),)))
    values = _upstream_values(bridge)
    assert values["n_decode_total"] == 4 and values["n_busy_slots_per_decode"] == 1.5

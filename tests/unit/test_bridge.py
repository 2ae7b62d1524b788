"""The bridge: its own state fed engine events by hand, and its submit /
cancel / close paths around the scripted engine of the fast tier."""

from __future__ import annotations

import trio

from mlxcel_trio.bridge import Bridge
from mlxcel_trio.config import ServerConfig
from mlxcel_trio.protocol.records import (
    CacheStats,
    Cancel,
    EngineStats,
    Failed,
    Finished,
    Job,
    MlxMemory,
    Shutdown,
    Sleeping,
    SlotTokens,
    Started,
    StepEvents,
    Submit,
    TokenPiece,
)
from mlxcel_trio.server.surfaces.info import prompt_cache_props
from mlxcel_trio.server.surfaces.metrics import upstream_values
from tests.fast.fake_engine import FakeEngine, fail, model_info, reply


# -- the bridge around a scripted engine (tests/fast/fake_engine.py) -------------

WAIT_S = 10.0


def _fake(script=None, *, n_slots: int = 2, load_error: str | None = None):
    """A config and an engine factory; `engines` receives the engine built."""
    config = ServerConfig(model="fake", n_parallel=n_slots, ctx_size=256 * n_slots)
    engines: list[FakeEngine] = []
    batches: list[StepEvents] = []

    def factory(emit):
        def counted(batch):  # engine thread: one call is one hop to trio
            batches.append(batch)
            emit(batch)
        engine = FakeEngine(counted, model_info("fake", n_slots=n_slots, n_ctx=256 * n_slots,
                                                n_vocab=0x110000),
                            script=script, load_error=load_error)
        engines.append(engine)
        return engine

    return config, factory, engines, batches


async def _started(nursery, script=None, **kw):
    config, factory, engines, batches = _fake(script, **kw)
    bridge = Bridge(config, factory)
    await nursery.start(bridge.run)
    with trio.fail_after(WAIT_S):
        await bridge.loaded.wait()
    return bridge, engines[0], batches


async def _commands(engine: FakeEngine, n: int) -> list:
    return [await trio.to_thread.run_sync(engine.next_command) for _ in range(n)]


def _job(bridge: Bridge, n_predict: int = -1) -> Job:
    return Job(bridge.next_job_id(), (1, 2, 3), n_predict=n_predict)


async def test_submit_streams_a_jobs_events_and_ends_its_channel(nursery):
    bridge, engine, _ = await _started(nursery, reply("abc"))
    assert bridge.ready and bridge.info.n_slots == 2
    job = _job(bridge)
    with trio.fail_after(WAIT_S):
        async with bridge.submit(job) as events:
            seen = [ev async for ev in events]   # ends: the channel closes after Finished
    kinds = [type(ev) for ev in seen]
    assert kinds == [Started, TokenPiece, TokenPiece, TokenPiece, Finished], seen
    assert "".join(ev.text for ev in seen if isinstance(ev, TokenPiece)) == "abc"
    assert seen[-1].content == "abc" and seen[-1].stop_type == "eos"
    # a finished job is not cancelled on the way out: the next command is the next job's
    later = _job(bridge, n_predict=1)
    async with bridge.submit(later) as events:
        async for _ in events:
            pass
    assert await _commands(engine, 2) == [Submit(job), Submit(later)]


async def test_leaving_submit_early_cancels_the_job(nursery):
    bridge, engine, _ = await _started(nursery, reply("abcdef", hold_after=1))
    job = _job(bridge)
    with trio.fail_after(WAIT_S):
        async with bridge.submit(job) as events:
            async for ev in events:
                if isinstance(ev, TokenPiece):
                    break   # the client goes away mid-generation
    assert await _commands(engine, 2) == [Submit(job), Cancel(job.id)]


async def test_a_cancelled_request_cancels_its_job(nursery):
    """A disconnect arrives as trio.Cancelled inside `submit`: the Cancel is
    posted synchronously on the way out."""
    bridge, engine, _ = await _started(nursery, reply("abcdef", hold_after=2))
    job = _job(bridge)
    with trio.move_on_after(WAIT_S) as scope:
        async with bridge.submit(job) as events:
            async for ev in events:
                if isinstance(ev, TokenPiece) and ev.n_decoded == 2:
                    scope.cancel()
    assert scope.cancelled_caught
    assert await _commands(engine, 2) == [Submit(job), Cancel(job.id)]


async def test_closing_a_handle_is_idempotent_and_cancels_every_live_job(nursery):
    bridge, engine, _ = await _started(nursery, reply("abcdef", hold_after=1))
    a, b = _job(bridge), _job(bridge)
    handle = bridge.open(a, b)
    with trio.fail_after(WAIT_S):
        pieces = set()
        async for ev in handle.events:
            if isinstance(ev, TokenPiece):
                pieces.add(ev.job_id)
            if pieces == {a.id, b.id}:
                break
    assert handle.live()
    handle.close()
    handle.close()
    assert not handle.live()
    got = await _commands(engine, 4)
    assert got[:2] == [Submit(a), Submit(b)] and set(got[2:]) == {Cancel(a.id), Cancel(b.id)}


async def test_a_failed_job_ends_its_channel_with_the_failure(nursery):
    bridge, _, _ = await _started(nursery, fail("exceed_context_size_error", "too long",
                                                (("n_ctx", 256),)))
    with trio.fail_after(WAIT_S):
        async with bridge.submit(_job(bridge)) as events:
            seen = [ev async for ev in events]
    assert seen == [Failed(seen[0].job_id, "exceed_context_size_error", "too long",
                           (("n_ctx", 256),))]


async def test_one_hop_per_engine_step(nursery):
    """Two jobs in one step arrive in one batch: when one job's k-th token
    is read, the other's k-th is already waiting in its own channel."""
    bridge, _, batches = await _started(nursery, reply("abcd"))
    a, b = _job(bridge), _job(bridge)
    ha, hb = bridge.open(a), bridge.open(b)
    n_before = len(batches)
    try:
        with trio.fail_after(WAIT_S):
            n_a = 0
            async for ev in ha.events:
                if isinstance(ev, TokenPiece):
                    n_a += 1
                    assert hb.events.statistics().current_buffer_used >= n_a
            seen_b = [ev async for ev in hb.events]
    finally:
        ha.close()
        hb.close()
    assert n_a == 4 and sum(isinstance(ev, TokenPiece) for ev in seen_b) == 4
    steps = batches[n_before:]
    assert len(steps) == 4, "one StepEvents per step, both jobs in each"
    assert all({ev.job_id for ev in s.events} == {a.id, b.id} for s in steps)


async def test_slot_action_answers_with_the_slots_tokens(nursery):
    bridge, _, _ = await _started(nursery, reply("ab"))
    job = _job(bridge)
    async with bridge.submit(job) as events:
        async for _ in events:
            pass
    with trio.fail_after(WAIT_S):
        saved = await bridge.slot_action(0, None)
        bad = await bridge.slot_action(7, None)
    assert isinstance(saved, SlotTokens) and saved.tokens == (1, 2, 3, ord("a"), ord("b"))
    assert isinstance(bad, Failed) and bad.code == "invalid_slot"


async def test_a_load_failure_is_reported_not_raised(nursery):
    config, factory, _, _ = _fake(load_error="OSError: no weights")
    bridge = Bridge(config, factory)
    await nursery.start(bridge.run)
    with trio.fail_after(WAIT_S):
        await bridge.loaded.wait()
    assert bridge.load_error == "OSError: no weights" and not bridge.ready


async def test_leaving_run_shuts_the_engine_down(nursery):
    config, factory, engines, _ = _fake(reply("abc", hold_after=0))
    bridge = Bridge(config, factory)
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as inner:
            await inner.start(bridge.run)
            with trio.fail_after(WAIT_S):
                await bridge.loaded.wait()
            bridge.open(_job(bridge))
            scope.cancel()
    got = await _commands(engines[0], 2)
    assert isinstance(got[0], Submit) and got[1] == Shutdown()


def _emitting(*steps):
    """A script that emits `steps` (engine-wide events) before a one-token reply."""
    def script(job, slot, vocab):
        yield from steps
        yield from reply("a")(job, slot, vocab)
    return script


async def _run_one(bridge: Bridge) -> None:
    with trio.fail_after(WAIT_S):
        async with bridge.submit(_job(bridge)) as events:
            async for _ in events:
                pass


async def test_a_sleep_empties_the_reported_prompt_cache(nursery):
    """Sleeping drops the scheduler and its prompt cache with it: /props must
    not keep reporting the entries and bytes of a cache that is gone."""
    bridge, _, _ = await _started(nursery, _emitting((CacheStats(3, 4096, 4096, 64 << 20, 2, 1),)))
    await _run_one(bridge)
    assert prompt_cache_props(bridge)["bytes"] == 4096
    bridge, _, _ = await _started(nursery, _emitting(
        (CacheStats(3, 4096, 4096, 64 << 20, 2, 1),), (Sleeping(1 << 20),)))
    await _run_one(bridge)
    props = prompt_cache_props(bridge)
    assert props["entries"] == 0 and props["bytes"] == 0
    assert props["enabled"] and props["budget_bytes"] == bridge.config.cache_ram << 20


async def test_metrics_read_the_engine_counters_the_events_carried(nursery):
    """n_decode_total and n_busy_slots_per_decode come from the latest
    EngineStats the bridge delivered, never from the engine object."""
    bridge, _, _ = await _started(nursery, _emitting((EngineStats(1, 2),), (EngineStats(4, 6),)))
    assert upstream_values(bridge)["n_decode_total"] == 0
    await _run_one(bridge)
    values = upstream_values(bridge)
    assert values["n_decode_total"] == 4 and values["n_busy_slots_per_decode"] == 1.5


async def test_metrics_report_mlx_memory_as_the_engine_last_read_it(nursery):
    """MLX's live arrays, buffer cache and peak, and the engine's memory
    releases, reach /metrics from the latest MlxMemory the bridge delivered
    (zeros before the first)."""
    from prometheus_client import generate_latest
    from prometheus_client.utils import floatToGoString as go

    from mlxcel_trio.server.surfaces.metrics import Metrics

    bridge, _, _ = await _started(nursery, _emitting(
        (MlxMemory(1 << 20, 32 << 20, 2 << 20),),
        (MlxMemory(3 << 20, 5 << 10, 4 << 20, releases=2, release_seconds=0.5,
                   released_bytes=7 << 20),)))
    metrics = Metrics(bridge)
    before = generate_latest(metrics.registry).decode()
    assert "mlxcel_mlx_active_bytes 0.0" in before
    await _run_one(bridge)
    body = generate_latest(metrics.registry).decode()
    assert f"mlxcel_mlx_active_bytes {go(3 << 20)}" in body
    assert f"mlxcel_mlx_cache_bytes {go(5 << 10)}" in body
    assert f"mlxcel_mlx_peak_bytes {go(4 << 20)}" in body
    assert "mlxcel_memory_releases_total 2.0" in body
    assert "mlxcel_memory_release_seconds_total 0.5" in body
    assert f"mlxcel_memory_released_bytes_total {go(7 << 20)}" in body


async def test_metrics_count_the_disk_writes_the_writer_dropped(nursery):
    """The disk tier's dropped writes reach /metrics from the CacheStats
    the engine last reported."""
    from prometheus_client import generate_latest

    from mlxcel_trio.server.surfaces.metrics import Metrics

    bridge, _, _ = await _started(nursery, _emitting(
        (CacheStats(1, 4096, 4096, -1, 0, 1, disk_write_dropped=3),)))
    await _run_one(bridge)
    body = generate_latest(Metrics(bridge).registry).decode()
    assert "mlxcel_prompt_cache_disk_writes_dropped_total 3.0" in body

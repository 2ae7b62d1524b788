"""The engine loop's idle sleep, driven in-process: the model really goes
(no mlx.nn.Module of it survives), and a Submit wakes it and is served."""

from __future__ import annotations

import gc
import queue
import threading

from mlxcel_trio.engine.loop import EngineLoop
from mlxcel_trio.engine.spec import EngineSpec
from mlxcel_trio.protocol.records import (
    Awake,
    Finished,
    Job,
    Loaded,
    SamplingParams,
    Shutdown,
    Sleeping,
    Submit,
    Wake,
    Woke,
)

WAIT_S = 60


def live_caches() -> int:
    from mlxcel_trio.engine.prompt_cache import PromptCache

    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is PromptCache)


def live_models() -> int:
    """mlx-lm model objects alive in this process (whatever the architecture)."""
    gc.collect()
    return sum(1 for o in gc.get_objects()
               if type(o).__name__ == "Model" and type(o).__module__.startswith("mlx_lm.models."))


def test_the_counters_see_a_live_model_and_cache(tiny_model):
    from mlx_lm.utils import load_model

    from mlxcel_trio.engine.prompt_cache import PromptCache, budget_from_mib

    model, _ = load_model(tiny_model)
    cache = PromptCache(budget_from_mib(1))
    assert live_models() == 1 and live_caches() == 1
    del model, cache
    assert live_models() == 0 and live_caches() == 0


def test_sleep_drops_the_model_and_a_submit_wakes_it(tiny_model):
    events: queue.SimpleQueue = queue.SimpleQueue()

    def emit(batch):
        for ev in batch.events:
            events.put(ev)

    def next_of(kind):
        while True:
            ev = events.get(timeout=WAIT_S)
            if isinstance(ev, kind):
                return ev

    engine = EngineLoop(EngineSpec(str(tiny_model), n_slots=1, ctx_size=512, batch_size=64,
                                   warmup=True, sleep_idle_s=0.2, cache_ram_mib=64), emit)
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    try:
        next_of(Loaded)
        next_of(Sleeping)
        assert live_models() == 0, "a reference kept the model alive through the sleep"
        assert live_caches() == 0, "the prompt cache (and its KV) outlived the sleep"
        greedy = SamplingParams(temperature=0.0)
        engine.post(Submit(Job(1, (5, 6, 7), n_predict=4, sampling=greedy, ignore_eos=True)))
        assert next_of(Woke).load_ms > 0
        done = next_of(Finished)
        assert done.job_id == 1 and len(done.tokens) == 4
        assert engine.n_decode >= 4, "the per-step counters survive the sleep"
        next_of(Sleeping)  # and it sleeps again after the next window
        assert live_models() == 0 and live_caches() == 0
        # a Wake reloads and is answered once the model is back (the routes
        # that read the model's context wait on it, as upstream's)
        engine.post(Wake(2))
        next_of(Woke)
        # (no live-model count here: under load the short idle window can
        # put it back to sleep before this thread looks)
        assert next_of(Awake).job_id == 2
    finally:
        engine.post(Shutdown())
        thread.join(WAIT_S)
    assert not thread.is_alive()

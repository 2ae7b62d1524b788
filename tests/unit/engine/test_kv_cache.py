"""KV caches stored in a -ctk / -ctv format, through continuous batching.

The reference is mlx-lm's own single-sequence QuantizedKVCache (what
`mlx_lm.generate --kv-bits` uses): three prompts of different lengths,
batched by the scheduler (left padding, merge, extend, filter, extract),
must produce exactly its greedy tokens.  The float formats must store the
type they name and, when that is the model's own, change nothing.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mlxcel_trio.engine.prompt_cache import PromptCache
from mlxcel_trio.protocol.records import Finished, Job, SamplingParams

from .test_scheduler import of, run

GREEDY = SamplingParams(temperature=0.0, n_probs=1)
PROMPTS = [tuple(range(40, 40 + n)) for n in (30, 7, 50)]
N = 20


@pytest.fixture(scope="module")
def loaded(tiny_wide_model):
    from mlx_lm.utils import load_model

    from mlxcel_trio.engine.vocab import Vocab

    model, _ = load_model(tiny_wide_model)
    return model, Vocab(tiny_wide_model)


def scheduler(loaded, kv, **kw):
    from mlxcel_trio.engine.scheduler import Scheduler

    model, vocab = loaded
    kw.setdefault("n_ctx_slot", 512)
    return Scheduler(model, vocab, n_slots=3, batch_size=16, kv_types=kv, **kw)


def batched(s, prompts=PROMPTS, first_id=1, n=N):
    out = []
    for i, p in enumerate(prompts):
        s.submit(Job(first_id + i, p, n_predict=n, sampling=GREEDY, ignore_eos=True,
                     cache_ns="raw"), out)
    run(s, out)
    return {f.job_id: f for f in of(out, Finished)}


def tokens(fin):
    return [p.token for p in fin.probs]


def mlx_lm_greedy(model, prompt, bits):
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import QuantizedKVCache

    cache = [QuantizedKVCache(group_size=32, bits=bits) for _ in model.layers]
    return [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=N,
                                             prompt_cache=cache,
                                             sampler=lambda x: mx.argmax(x, -1))]


# (mlx-lm sizes a 5-bit row as dim // 6 words: right for these 32-wide heads only)
@pytest.mark.parametrize(("name", "bits"), [("q8_0", 8), ("q4_1", 4), ("q5_0", 5)])
def test_batched_quantized_cache_matches_mlx_lm_single_sequence(loaded, name, bits):
    got = batched(scheduler(loaded, (name, name)))
    for i, prompt in enumerate(PROMPTS):
        assert tokens(got[i + 1]) == mlx_lm_greedy(loaded[0], prompt, bits), (name, i)


def test_a_float_type_equal_to_the_model_type_changes_nothing(loaded):
    default = batched(scheduler(loaded, ("f16", "f16")))
    stored = batched(scheduler(loaded, ("f32", "f32")))  # the fixture computes in float32
    assert {j: tokens(f) for j, f in stored.items()} == {j: tokens(f) for j, f in default.items()}


def donated(loaded, kv):
    cache = PromptCache(None)
    batched(scheduler(loaded, kv, prompt_cache=cache), prompts=PROMPTS[:1], n=4)
    (entry,) = cache._lru.values()
    return entry


def test_each_type_is_stored_as_named_and_costs_what_it_should(loaded):
    import mlx.core as mx

    plain = donated(loaded, ("f16", "f16"))
    mixed = donated(loaded, ("bf16", "f32")).layers[0]
    assert (mixed.keys[0].dtype, mixed.values[0].dtype) == (mx.bfloat16, mx.float32)
    q8 = donated(loaded, ("q8_0", "q8_0"))
    q4 = donated(loaded, ("q4_0", "iq4_nl"))
    assert q8.layers[0].keys[0].dtype == mx.uint32 and q8.layers[0].bits == 8
    # per 32 float32 values (128 bytes): 8 bits pack 32 bytes, 4 bits 16, plus a
    # float32 scale and bias (8 bytes) per group
    assert q8.nbytes * 128 == plain.nbytes * 40
    assert q4.nbytes * 128 == plain.nbytes * 24


def test_a_quantized_prompt_cache_hit_equals_the_cold_run(loaded):
    cold = batched(scheduler(loaded, ("q8_0", "q8_0")))
    s = scheduler(loaded, ("q8_0", "q8_0"), prompt_cache=PromptCache(None))
    batched(s, n=2)                     # fills the cache with each prompt's KV
    hit = batched(s, first_id=10)
    for i in range(len(PROMPTS)):
        assert hit[10 + i].timings.cache_n == len(PROMPTS[i]) - 1
        assert tokens(hit[10 + i]) == tokens(cold[1 + i]), i


def test_context_shift_runs_over_a_quantized_cache(loaded):
    s = scheduler(loaded, ("q8_0", "q8_0"), n_ctx_slot=40, context_shift=True)
    (fin,) = batched(s, prompts=PROMPTS[:1], n=60).values()
    assert len(fin.probs) == 60 and fin.truncated


def test_a_model_with_other_cache_layers_is_refused():
    from mlx_lm.models.cache import KVCache, RotatingKVCache

    from mlxcel_trio.engine.kv_cache import CacheFactory

    model = SimpleNamespace(layers=[0, 0],
                            make_cache=lambda: [KVCache(), RotatingKVCache(max_size=8)])
    reason = CacheFactory(model, "q8_0", "q8_0").check()
    assert reason is not None and "RotatingKVCache" in reason and "-ctk f16 -ctv f16" in reason
    assert CacheFactory(model, "f16", "f16").check() is None


def test_the_preflight_asks_the_model_class_for_its_cache_kinds():
    """Before any weight is read: a sliding-window model's -ctk q8_0 is
    refused, a hybrid's recurrent layers do not stand in the way, and the
    default types never build the class."""
    from fixtures.build import ensure

    from mlxcel_trio.engine.architectures import problem

    reason = problem(ensure("tiny-swa"), ("q8_0", "q8_0"))
    assert reason is not None and reason.startswith("-ctk q8_0 -ctv q8_0: ")
    assert "RotatingKVCache (sliding-window attention) layers" in reason
    assert "use -ctk f16 -ctv f16" in reason
    assert problem(ensure("tiny-swa"), ("bf16", "f16")) is not None
    assert problem(ensure("tiny-swa"), ("f16", "f16")) is None
    assert problem(ensure("tiny-hybrid"), ("q8_0", "q8_0")) is None

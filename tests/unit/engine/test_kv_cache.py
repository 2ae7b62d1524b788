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


def _fake(*layers):
    return SimpleNamespace(layers=list(layers), make_cache=lambda: [type(c)(*a) for c, a in layers],
                           parameters=lambda: {}, named_modules=lambda: [])


def test_global_layers_take_the_type_and_sliding_windows_keep_theirs():
    from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

    from mlxcel_trio.engine.kv_cache import CacheFactory, StoredKVCache

    model = _fake((RotatingKVCache(8), (8,)), (KVCache(), ()), (RotatingKVCache(8), (8,)),
                  (ArraysCache(2), (2,)), (KVCache(), ()))
    f = CacheFactory(model, "q8_0", "q8_0")
    assert f.check() is None
    got = f()
    assert [type(c) for c in got] == [RotatingKVCache, StoredKVCache, RotatingKVCache,
                                      ArraysCache, StoredKVCache]
    assert got[1].bits == 8 and not hasattr(got[0], "bits")
    assert f.summary() == (
        "-ctk q8_0 -ctv q8_0 on 2 of 5 layers; 2 sliding-window layers keep the model's "
        "float type (no quantized or retyped window cache); 1 recurrent layer keeps its "
        "own state (no per-token K/V)")


def test_a_model_no_layer_of_which_can_take_the_type_is_refused():
    from mlx_lm.models.cache import ArraysCache, ChunkedKVCache, KVCache, RotatingKVCache

    from mlxcel_trio.engine.kv_cache import CacheFactory

    windows = _fake((RotatingKVCache(8), (8,)), (ArraysCache(2), (2,)))
    reason = CacheFactory(windows, "q8_0", "q8_0").check()
    assert reason == (
        "-ctk q8_0 -ctv q8_0: every attention layer of this model is a sliding-window "
        "(RotatingKVCache) layer, which mlxcel-trio stores only in the model's own float "
        "type, so no layer can take this type; use -ctk f16 -ctv f16")
    assert CacheFactory(windows, "f16", "f16").check() is None
    other = CacheFactory(_fake((KVCache(), ()), (ChunkedKVCache(4), (4,))), "bf16", "f16")
    assert "keeps ChunkedKVCache layers" in other.check()


def test_the_preflight_asks_the_model_class_for_its_cache_kinds(tmp_path):
    """Before any weight is read: a model whose every attention layer is a
    sliding window is refused, one with a global layer beside its windows
    and a hybrid's recurrent layers do not stand in the way, and the
    default types never build the class."""
    import json

    from fixtures.build import ensure

    from mlxcel_trio.engine.architectures import problem

    assert problem(ensure("tiny-swa"), ("q8_0", "q8_0")) is None   # one global layer
    assert problem(ensure("tiny-swa"), ("bf16", "f16")) is None
    assert problem(ensure("tiny-swa"), ("f16", "f16")) is None
    assert problem(ensure("tiny-hybrid"), ("q8_0", "q8_0")) is None
    # gemma3_text makes layer i global when i % pattern == pattern - 1: none of 3
    cfg = json.loads((ensure("tiny-swa") / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "sliding_window_pattern": 4}))
    reason = problem(tmp_path, ("q8_0", "q8_0"))
    assert reason is not None and reason.startswith("-ctk q8_0 -ctv q8_0: every attention "
                                                    "layer of this model is a sliding-window")
    assert problem(tmp_path, ("f16", "f16")) is None


@pytest.fixture(scope="module")
def swa():
    from fixtures.build import ensure
    from mlx_lm.utils import load_model

    from mlxcel_trio.engine.vocab import Vocab

    path = ensure("tiny-swa")
    model, _ = load_model(path)
    return model, Vocab(path)


SWA_PROMPTS = [tuple(range(40, 40 + n)) for n in (45, 7, 60)]   # past the 32-token window


def test_a_sliding_window_model_batched_over_mixed_caches_matches_mlx_lm(swa):
    """tiny-swa's global layer in q8_0, its two windows in float32: the
    scheduler's batch (merge, extend, filter, extract over both kinds) gives
    mlx-lm's own single-sequence tokens with QuantizedKVCache on the global
    layer and the model's RotatingKVCache on the windows."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    model, vocab = swa
    got = batched(scheduler(swa, ("q8_0", "q8_0")), prompts=SWA_PROMPTS, n=40)
    eos = mx.array(sorted(vocab.eos_ids))

    def greedy_no_eos(logits):   # as the jobs' ignore_eos
        logits[..., eos] = -float("inf")
        return mx.argmax(logits, -1)

    for i, prompt in enumerate(SWA_PROMPTS):
        cache = [QuantizedKVCache(group_size=32, bits=8) if type(c) is KVCache else c
                 for c in model.make_cache()]
        want = [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=40,
                                                 prompt_cache=cache, sampler=greedy_no_eos)]
        assert tokens(got[i + 1]) == want, i
    # the global layer really is quantized: float KV gives other tokens
    plain = batched(scheduler(swa, ("f16", "f16")), prompts=SWA_PROMPTS, n=40)
    assert any(tokens(plain[i]) != tokens(got[i]) for i in got)


def test_a_prompt_cache_hit_over_mixed_caches_equals_the_cold_run(swa):
    from mlx_lm.models.cache import RotatingKVCache

    from mlxcel_trio.engine.kv_cache import StoredKVCache

    cold = batched(scheduler(swa, ("q8_0", "q8_0")), prompts=SWA_PROMPTS, n=12)
    cache = PromptCache(None)
    s = scheduler(swa, ("q8_0", "q8_0"), prompt_cache=cache)
    batched(s, prompts=SWA_PROMPTS, n=2)
    kinds = {tuple(type(c) for c in e.layers) for e in cache._lru.values()}
    assert kinds == {(RotatingKVCache, RotatingKVCache, StoredKVCache)}
    hit = batched(s, prompts=SWA_PROMPTS, first_id=10, n=12)
    for i in range(len(SWA_PROMPTS)):
        assert hit[10 + i].timings.cache_n > 0, i
        assert tokens(hit[10 + i]) == tokens(cold[1 + i]), i

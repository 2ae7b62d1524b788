"""A decoder layer as one native node (native/fused.py, graph.cpp's
NativeFusedLayer) against the same layer run as mlx-lm wrote it, on the
same kernels: outputs and KV caches agree, and the cases it does not cover
fall back.  Tolerances: 16-bit weights give the unfused path's products in
another order (1e-4 on logits of std ~1); the int16 affine kernels round
the activations per call, so a 1-ulp change of an input can move a product
by its rounding step (1e-3 on 4-/8-bit).  White-box: whether the node ran
is read off its counters (fused.counts()), and the unfused reference is the
block's original class (`unfused_class`)."""

from __future__ import annotations

import contextlib

import pytest

FORMS = ("bf16", "f16", "4bit", "8bit")


def _tol(form: str) -> float:
    return 1e-4 if form in ("bf16", "f16") else 1e-3


@pytest.fixture
def graph():
    from mlxcel_trio.engine import native
    from mlxcel_trio.engine.native import library

    st = native.status()
    if not st.available or library._graph is None:
        pytest.skip(f"the MLX primitive is unavailable here: {st.detail}")
    return native


def build(family: str, form: str, **shape):
    """A small random model of mlx-lm's `family` on the kernels."""
    import importlib

    import mlx.core as mx
    from mlx import nn

    from mlxcel_trio.engine.native import layers

    mod = importlib.import_module(f"mlx_lm.models.{family}")
    cfg = dict(model_type=family, hidden_size=64, num_hidden_layers=2, intermediate_size=128,
               num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=300,
               tie_word_embeddings=False, rope_theta=10000.0, max_position_embeddings=4096)
    if family == "qwen3":
        cfg["head_dim"] = 16
    cfg.update(shape)
    mx.random.seed(7)
    model = mod.Model(mod.ModelArgs.from_dict(cfg))
    if form in ("bf16", "f16"):
        model.set_dtype(mx.bfloat16 if form == "bf16" else mx.float16)
    else:
        nn.quantize(model, group_size=32, bits=int(form[0]))
    mx.eval(model.parameters())
    layers.install(model)
    return model


@contextlib.contextmanager
def unfused(model):
    """The model's blocks as mlx-lm wrote them while in the block."""
    blocks = [m for m in model.layers if hasattr(type(m), "unfused_class")]
    fused_cls = [type(m) for m in blocks]
    for m in blocks:
        m.__class__ = type(m).unfused_class
    try:
        yield model
    finally:
        for m, cls in zip(blocks, fused_cls):
            m.__class__ = cls


def nodes() -> int:
    from mlxcel_trio.engine.native import fused

    return fused.counts()[0]


def decode(model, cache, prompt, steps: int, tokens: int = 1):
    """Prefill `prompt` (rows: a batch), then `steps` steps of `tokens`
    fixed tokens; the logits of each step and the fused nodes run."""
    import mlx.core as mx

    if prompt is not None:
        mx.eval(model(mx.array(prompt), cache=cache))
    before, out = nodes(), []
    rows = len(prompt) if prompt is not None else 1
    for s in range(steps):
        x = mx.array([[(7 * s + 3 * r + t) % 300 for t in range(tokens)] for r in range(rows)])
        y = model(x, cache=cache)
        mx.eval(y, [c.state for c in cache])
        out.append(y)
    return mx.concatenate(out, 1), nodes() - before


def close(a, b, tol: float) -> bool:
    import mlx.core as mx

    return a.shape == b.shape and mx.allclose(a, b, rtol=tol, atol=tol).item()


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("family,shape", [("qwen3", {}), ("llama", {}),
                                          ("llama", {"num_key_value_heads": 4}),
                                          ("qwen2", {"rope_traditional": True})])
def test_fused_layer_equals_the_unfused_one(graph, family, shape, form):
    from mlx_lm.models.cache import make_prompt_cache

    model = build(family, form, **shape)
    prompt = [[1, 5, 9, 20, 33, 7]]
    caches = make_prompt_cache(model), make_prompt_cache(model)
    got, n = decode(model, caches[0], prompt, 5)
    assert n == 5 * len(model.layers)            # every decode step took the node
    with unfused(model):
        want, n0 = decode(model, caches[1], prompt, 5)
    assert n0 == 0
    tol = _tol(form)
    assert close(got, want, tol)
    for a, b in zip(*caches):
        assert a.offset == b.offset == 11
        assert close(a.keys[..., :11, :], b.keys[..., :11, :], tol)
        assert close(a.values[..., :11, :], b.values[..., :11, :], tol)


@pytest.mark.parametrize("form", ("bf16", "4bit"))
@pytest.mark.parametrize("family", ("qwen3", "llama"))
def test_offset_zero_and_a_few_tokens(graph, family, form):
    """A preallocated cache at offset 0, then 3 tokens per step (causal
    among themselves)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    model = build(family, form)
    caches = make_prompt_cache(model), make_prompt_cache(model)
    for cache in caches:
        for c in cache:
            c.keys, c.values = mx.zeros((1, 2, 256, 16)), mx.zeros((1, 2, 256, 16))
    got, n = decode(model, caches[0], None, 3, tokens=3)
    with unfused(model):
        want, _ = decode(model, caches[1], None, 3, tokens=3)
    assert n == 3 * len(model.layers)
    assert close(got, want, _tol(form))
    assert all(close(a.keys[..., :9, :], b.keys[..., :9, :], _tol(form))
               for a, b in zip(*caches))


@pytest.mark.parametrize("form", ("bf16", "8bit"))
@pytest.mark.parametrize("family", ("qwen3", "llama"))
def test_batch_cache_with_left_padding(graph, family, form):
    """mlx-lm's BatchKVCache (the BatchGenerator's): rows of different
    lengths, left-padded, each at its own offset."""
    from mlx_lm.models.cache import BatchKVCache

    model = build(family, form)
    lengths = (5, 2, 7)
    pad = [max(lengths) - n for n in lengths]
    prompt = [[0] * p + [(11 * r + t) % 300 for t in range(n)]
              for r, (p, n) in enumerate(zip(pad, lengths))]
    caches = [[BatchKVCache(pad) for _ in model.layers] for _ in range(2)]
    got, n = decode(model, caches[0], prompt, 4)
    with unfused(model):
        want, _ = decode(model, caches[1], prompt, 4)
    assert n == 4 * len(model.layers)
    assert close(got, want, _tol(form))
    for a, b in zip(*caches):
        assert a._idx == b._idx == 11 and a.offset.tolist() == b.offset.tolist()
        for r, p in enumerate(pad):
            assert close(a.keys[r, :, p:11], b.keys[r, :, p:11], _tol(form))
            assert close(a.values[r, :, p:11], b.values[r, :, p:11], _tol(form))


def test_the_cache_is_written_in_place_unless_referenced(graph):
    """MLX's donation rule: the cache buffer is reused when nothing else
    holds it; a snapshot someone keeps is copied, not overwritten."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from mlxcel_trio.engine.native import fused

    model = build("qwen3", "bf16")
    cache = make_prompt_cache(model)
    decode(model, cache, [[1, 2, 3]], 1)
    before = fused.counts()
    decode(model, cache, None, 2)
    _, donated, copied = (a - b for a, b in zip(fused.counts(), before))
    assert donated == 2 * 2 * len(model.layers) and copied == 0
    pos = cache[0].offset
    kept = cache[0].keys                          # a reference held elsewhere
    snapshot = mx.array(kept[..., :8, :])
    mx.eval(snapshot)
    before = fused.counts()
    decode(model, cache, None, 1)
    assert fused.counts()[2] - before[2] >= 1     # that layer's keys were copied
    assert mx.array_equal(kept[..., :8, :], snapshot).item()
    new = cache[0].keys[..., pos, :]
    assert not mx.array_equal(new, kept[..., pos, :]).item() and mx.any(new != 0).item()


def test_pipelined_decode_writes_the_cache_in_place(graph):
    """mlx-lm's generate_step builds and dispatches step t+1 while step t
    still runs, and MLX holds step t's buffers (the cache's among them)
    until it ends: the node waits for it rather than copying the cache.
    Steps of a few ms (hidden 1024) so that the step before is in flight,
    after a prompt long enough (2 KiB of keys per position) that the live
    cache is one the node waits for rather than copies; the logits equal
    the same steps evaluated one at a time."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from mlxcel_trio.engine.native import fused

    model = build("qwen3", "bf16", hidden_size=1024, intermediate_size=3072,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=128)
    tokens = [[(11 * s) % 300] for s in range(12)]

    def run(pipelined: bool):
        cache = make_prompt_cache(model)
        mx.eval(model(mx.array([[(5 * i) % 300 for i in range(160)]]), cache=cache))
        before, out = fused.counts(), []
        pending = None
        for t in tokens:
            y = model(mx.array([t]), cache=cache)
            if pipelined:
                mx.async_eval(y)
                if pending is not None:
                    mx.eval(pending)
                    out.append(pending)
                pending = y
            else:
                mx.eval(y)
                out.append(y)
        if pending is not None:
            mx.eval(pending)
            out.append(pending)
        return mx.concatenate(out, 1), [a - b for a, b in zip(fused.counts(), before)]

    want, _ = run(False)
    got, (n, donated, copied) = run(True)
    assert n == len(tokens) * len(model.layers)
    assert copied == 0 and donated == 2 * n
    assert close(got, want, 1e-5)


def test_what_the_node_does_not_take_falls_back(graph):
    import mlx.core as mx
    from mlx_lm.models.cache import QuantizedKVCache, RotatingKVCache, make_prompt_cache
    from mlx_lm.tuner.lora import LoRALinear

    model = build("llama", "bf16", hidden_size=128)   # head_dim 32: a quantizable cache
    # a prefill of more than a few tokens per sequence
    cache = make_prompt_cache(model)
    n0 = nodes()
    mx.eval(model(mx.array([list(range(1, 9))]), cache=cache))
    assert nodes() == n0
    # other cache kinds
    for kind in (lambda: QuantizedKVCache(group_size=32, bits=8), lambda: RotatingKVCache(64)):
        _, n = decode(model, [kind() for _ in model.layers], [[1, 2, 3, 4, 5]], 2)
        assert n == 0
    # an explicit array mask on a plain cache
    cache = make_prompt_cache(model)
    decode(model, cache, [[1, 2, 3, 4, 5]], 1)
    block = model.layers[0]
    n0 = nodes()
    x = mx.random.normal((1, 1, 128))
    mx.eval(block(x, mx.array([[True] * 7]), cache[0]))
    assert nodes() == n0 and cache[0].offset == 7
    # a LoRA adapter on a projection: that layer unfused, the other fused
    model.layers[0].self_attn.q_proj = LoRALinear.from_base(model.layers[0].self_attn.q_proj, r=2)
    _, n = decode(model, make_prompt_cache(model), [[1, 2, 3]], 2)
    assert n == 2 * (len(model.layers) - 1)


def test_switched_off_or_without_the_primitive(graph, monkeypatch):
    from mlxcel_trio.engine.native import fused, library

    monkeypatch.setenv(fused.ENV, "0")
    assert fused.installed(build("qwen3", "bf16")) == 0
    monkeypatch.delenv(fused.ENV)
    assert fused.installed(build("llama", "4bit")) == 2
    monkeypatch.setattr(library, "_graph", None)   # the ctypes path: no nodes at all
    assert fused.installed(build("qwen3", "bf16")) == 0


@pytest.mark.parametrize("kind", ("tiny-bf16", "tiny-4bit"))
def test_greedy_tokens_fused_and_unfused(graph, kind):
    """mlx-lm's generate_step (pipelined with async_eval) on the tiny
    fixtures: the same 32 greedy tokens either way."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model

    from fixtures.build import ensure
    from mlxcel_trio.engine import weights
    from mlxcel_trio.engine.native import fused

    model, _ = weights.apply(load_model(ensure(kind), lazy=True)[0], "keep")
    assert fused.installed(model) == len(model.layers)

    def greedy():
        return [int(t) for t, _ in generate_step(mx.array(list(range(40, 56))), model,
                                                 max_tokens=32,
                                                 sampler=lambda x: mx.argmax(x, -1))]

    n0 = nodes()
    tokens = greedy()
    assert nodes() - n0 >= 31 * len(model.layers)   # every decode step (one runs ahead)
    with unfused(model):
        assert tokens == greedy()

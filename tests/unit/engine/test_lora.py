"""LoRA adapters: reading both layouts, the adapted forward against merged
weights, and the scheduler decoding mixed scale vectors in one batch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mlxcel_trio.protocol.records import Finished, Job, SamplingParams, Started

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def mlx_adapter():
    from fixtures.build import ensure

    return ensure("tiny-lora")


@pytest.fixture(scope="module")
def peft_adapter():
    from fixtures.build import ensure

    return ensure("tiny-lora-peft")


def _load(path: Path):
    from mlx_lm.utils import load_model

    model, _ = load_model(path)
    return model


def _logits(model, tokens, rows=None):
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from mlxcel_trio.engine.lora import AdapterRows

    cache = None
    if rows is not None:
        cache = [*make_prompt_cache(model), AdapterRows(rows)]
    out = model(mx.array(tokens), cache=cache)
    mx.eval(out)
    return np.array(out)


def _merged(path: Path, adapters, scales):
    """The base model with s * scaling * (A @ B) added to each weight: what
    merging the adapters at those scales would serve."""
    import mlx.core as mx

    model = _load(path)
    named = dict(model.named_modules())
    for adapter, s in zip(adapters, scales):
        for module, low in adapter.modules.items():
            layer = named[module]
            delta = (s * low.scaling * (low.a @ low.b)).T
            layer.weight = layer.weight + mx.array(delta)
    return model


# -- reading -------------------------------------------------------------------

def test_both_layouts_read_to_the_same_form(mlx_adapter, peft_adapter):
    from mlxcel_trio.engine.lora_files import read_adapter

    a = read_adapter(str(mlx_adapter))
    assert a.layout == "mlx-lm" and len(a.modules) == 2 * 4
    low = a.modules["model.layers.0.self_attn.q_proj"]
    assert low.a.shape == (64, 4) and low.b.shape == (4, 64) and low.scaling == 2.0
    p = read_adapter(str(peft_adapter / "adapter_config.json"))
    assert p.layout == "peft" and len(p.modules) == 2 * 4
    low = p.modules["model.layers.1.mlp.down_proj"]
    # lora_A (r, in) and lora_B (out, r), transposed; alpha 16 / r 8
    assert low.a.shape == (128, 8) and low.b.shape == (8, 64) and low.scaling == 2.0
    import mlx.core as mx

    raw = mx.load(str(peft_adapter / "adapter_model.safetensors"))
    np.testing.assert_array_equal(
        low.a, np.array(raw["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"]).T)


def _peft(tmp_path: Path, config: dict, tensors: dict | None = None) -> Path:
    import mlx.core as mx

    d = tmp_path / "peft"
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(0)
    tensors = tensors or {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": rng.normal(size=(4, 64)),
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": rng.normal(size=(64, 4)),
    }
    mx.save_safetensors(str(d / "adapter_model.safetensors"),
                        {k: mx.array(np.asarray(v, dtype=np.float32)) for k, v in tensors.items()})
    return d


def test_peft_scaling_rules(tmp_path):
    from mlxcel_trio.engine.lora_files import read_adapter

    base = {"peft_type": "LORA", "r": 4, "lora_alpha": 8}
    assert read_adapter(str(_peft(tmp_path, base))).modules[
        "model.layers.0.self_attn.q_proj"].scaling == 2.0
    rs = tmp_path / "rs"
    rs.mkdir()
    d = _peft(rs, {**base, "use_rslora": True})
    assert read_adapter(str(d)).modules["model.layers.0.self_attn.q_proj"].scaling == 4.0
    pat = tmp_path / "pat"
    pat.mkdir()
    d = _peft(pat, {**base, "alpha_pattern": {"q_proj": 2}, "rank_pattern": {"q_proj": 4}})
    assert read_adapter(str(d)).modules["model.layers.0.self_attn.q_proj"].scaling == 0.5


@pytest.mark.parametrize(("config", "tensors", "needle"), [
    ({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "use_dora": True}, None, "DoRA"),
    ({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "modules_to_save": ["lm_head"]}, None,
     "modules_to_save"),
    ({"peft_type": "LORA", "r": 4, "lora_alpha": 8},
     {"base_model.model.model.embed_tokens.lora_embedding_A": np.zeros((4, 8))},
     "not a LoRA matrix"),
    ({"peft_type": "LORA", "r": 4, "lora_alpha": 8},
     {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": np.zeros((4, 64))},
     "only one of its two"),
    ({"peft_type": "IA3"}, None, "is not LORA"),
])
def test_adapters_no_scale_can_apply_are_refused(tmp_path, config, tensors, needle):
    from mlxcel_trio.engine.lora_files import AdapterError, adapter_problem, read_adapter

    d = _peft(tmp_path, config, tensors)
    with pytest.raises(AdapterError, match=needle):
        read_adapter(str(d))
    if tensors is None:  # a config-level refusal shows before anything loads
        assert needle in (adapter_problem(str(d)) or "")


@pytest.mark.parametrize(("kind", "needle"), [("dora", "DoRA"), ("full", "full-weight")])
def test_mlx_dora_and_full_are_refused(tmp_path, kind, needle):
    from mlxcel_trio.engine.lora_files import adapter_problem

    (tmp_path / "adapter_config.json").write_text(json.dumps(
        {"fine_tune_type": kind, "lora_parameters": {"rank": 4, "scale": 1.0}}))
    assert needle in adapter_problem(str(tmp_path))


def test_missing_things_are_named(tmp_path):
    from mlxcel_trio.engine.lora_files import adapter_problem

    assert "no such adapter directory" in adapter_problem(str(tmp_path / "nope"))
    assert "no adapter_config.json" in adapter_problem(str(tmp_path))
    (tmp_path / "adapter_config.json").write_text("{")
    assert "not valid JSON" in adapter_problem(str(tmp_path))
    (tmp_path / "adapter_config.json").write_text(json.dumps(
        {"lora_parameters": {"rank": 4, "scale": 1.0}}))
    assert "adapters.safetensors is missing" in adapter_problem(str(tmp_path))


def test_shapes_that_do_not_fit_the_model_are_refused(tiny_wide_model, mlx_adapter):
    from mlxcel_trio.engine.lora import install
    from mlxcel_trio.engine.lora_files import AdapterError, read_adapter

    with pytest.raises(AdapterError, match="takes 64 inputs and gives .* outputs, but the adapter.s matrices are"):
        install(_load(tiny_wide_model), [read_adapter(str(mlx_adapter))])


# -- the forward -----------------------------------------------------------------

TOKENS = [[5, 9, 100, 20, 7, 300, 41]]


def test_scale_zero_is_the_base_model_bit_for_bit(tiny_model, mlx_adapter, peft_adapter):
    from mlxcel_trio.engine.lora import install
    from mlxcel_trio.engine.lora_files import read_adapter

    base = _logits(_load(tiny_model), TOKENS)
    adapted = install(_load(tiny_model), [read_adapter(str(mlx_adapter)),
                                          read_adapter(str(peft_adapter))])
    np.testing.assert_array_equal(_logits(adapted, TOKENS, [(0.0, 0.0)]), base)
    np.testing.assert_array_equal(_logits(adapted, TOKENS), base)  # no rows at all


@pytest.mark.parametrize("scales", [(1.0, 0.0), (0.0, 0.5), (0.8, -1.5)])
def test_scales_equal_merged_weights(tiny_model, mlx_adapter, peft_adapter, scales):
    from mlxcel_trio.engine.lora import install
    from mlxcel_trio.engine.lora_files import read_adapter

    adapters = [read_adapter(str(mlx_adapter)), read_adapter(str(peft_adapter))]
    adapted = install(_load(tiny_model), adapters)
    got = _logits(adapted, TOKENS, [scales])
    want = _logits(_merged(tiny_model, adapters, scales), TOKENS)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert np.abs(got - _logits(_load(tiny_model), TOKENS)).max() > 0.1  # it did something


def test_a_batch_row_uses_its_own_scales(tiny_model, mlx_adapter, peft_adapter):
    from mlxcel_trio.engine.lora import install
    from mlxcel_trio.engine.lora_files import read_adapter

    adapted = install(_load(tiny_model), [read_adapter(str(mlx_adapter)),
                                          read_adapter(str(peft_adapter))])
    rows = [(0.0, 0.0), (1.0, 0.0), (0.3, 0.7)]
    batch = _logits(adapted, TOKENS * 3, rows)
    for i, row in enumerate(rows):
        np.testing.assert_allclose(batch[i], _logits(adapted, TOKENS, [row])[0],
                                   rtol=1e-5, atol=1e-5)


def test_adapters_on_a_quantized_base(mlx_adapter):
    """On a 4-bit base the term adds to the QuantizedLinear's output: the
    result equals the adapter merged into the dequantized weights."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_unflatten

    from fixtures.build import ensure
    from mlxcel_trio.engine.lora import AdaptedLinear, install
    from mlxcel_trio.engine.lora_files import read_adapter

    q = ensure("tiny-4bit")
    adapter = read_adapter(str(mlx_adapter))
    adapted = install(_load(q), [adapter])
    layer = dict(adapted.named_modules())["model.layers.0.self_attn.q_proj"]
    assert isinstance(layer, AdaptedLinear) and isinstance(layer.base, nn.QuantizedLinear)
    base = _logits(_load(q), TOKENS)
    np.testing.assert_array_equal(_logits(adapted, TOKENS, [(0.0,)]), base)
    reference = _load(q)
    named = dict(reference.named_modules())
    merged = []
    for module, low in adapter.modules.items():
        ql = named[module]
        w = mx.dequantize(ql.weight, ql.scales, ql.biases, ql.group_size, ql.bits)
        linear = nn.Linear(w.shape[1], w.shape[0], bias=False)
        linear.weight = w + mx.array((0.5 * low.scaling * (low.a @ low.b)).T).astype(w.dtype)
        merged.append((module, linear))
    reference.update_modules(tree_unflatten(merged))
    got = _logits(adapted, TOKENS, [(0.5,)])
    assert np.abs(got - base).max() > 0.1
    np.testing.assert_allclose(got, _logits(reference, TOKENS), rtol=1e-3, atol=1e-3)


# -- the scheduler ----------------------------------------------------------------

@pytest.fixture(scope="module")
def adapted(tiny_model, mlx_adapter, peft_adapter):
    from mlxcel_trio.engine.lora import install
    from mlxcel_trio.engine.lora_files import read_adapter
    from mlxcel_trio.engine.vocab import Vocab

    model = install(_load(tiny_model), [read_adapter(str(mlx_adapter)),
                                        read_adapter(str(peft_adapter))])
    return model, Vocab(tiny_model)


def _scheduler(adapted, slots=8, cache=None):
    from mlxcel_trio.engine.scheduler import Scheduler

    model, vocab = adapted
    return Scheduler(model, vocab, n_slots=slots, n_ctx_slot=256, batch_size=64,
                     n_adapters=2, prompt_cache=cache)


def _run(s, out):
    for _ in range(2000):
        if not s.busy:
            return out
        s.step(out)
    raise AssertionError("scheduler did not drain")


def _job(i, lora, prompt=(5, 6, 7, 8), **kw):
    return Job(i, tuple(prompt), n_predict=12, sampling=GREEDY, ignore_eos=True,
               lora=lora, **kw)


MIXES = [(0.0, 0.0), (1.0, 0.0), (0.0, 1.0), (1.0, 1.0), (0.5, 0.0), (0.0, 0.25),
         (2.0, -1.0), (0.7, 0.3)]


def test_eight_mixes_in_one_batch_equal_their_solo_runs(adapted):
    solo = {}
    for i, mix in enumerate(MIXES):
        s, out = _scheduler(adapted, slots=1), []
        s.submit(_job(i, mix), out)
        (fin,) = [e for e in _run(s, out) if isinstance(e, Finished)]
        solo[i] = fin.tokens
    assert len(set(solo.values())) >= 6  # the mixes really differ
    s, out = _scheduler(adapted), []
    for i, mix in enumerate(MIXES):
        s.submit(_job(i, mix), out)
    _run(s, out)
    batched = {e.job_id: e.tokens for e in out if isinstance(e, Finished)}
    assert batched == solo


def test_sequences_leaving_and_joining_keep_their_scales(adapted):
    """A short job finishes mid-batch (filter) and a new one joins (extend):
    the others keep decoding with their own vectors."""
    want = {}
    for i, (mix, n) in enumerate([((1.0, 0.0), 3), ((0.0, 1.0), 12), ((0.5, 0.5), 12)]):
        s, out = _scheduler(adapted, slots=1), []
        s.submit(attrs_evolve(_job(i, mix), n_predict=n), out)
        want[i] = next(e.tokens for e in _run(s, out) if isinstance(e, Finished))
    s, out = _scheduler(adapted, slots=2), []
    s.submit(attrs_evolve(_job(0, (1.0, 0.0)), n_predict=3), out)
    s.submit(_job(1, (0.0, 1.0)), out)
    s.submit(_job(2, (0.5, 0.5)), out)  # waits for job 0's slot
    _run(s, out)
    assert {e.job_id: e.tokens for e in out if isinstance(e, Finished)} == want


def attrs_evolve(job, **kw):
    import attrs

    return attrs.evolve(job, **kw)


def test_the_prompt_cache_never_shares_a_prefix_across_scales(adapted):
    from mlxcel_trio.engine.prompt_cache import PromptCache

    s, out = _scheduler(adapted, slots=1, cache=PromptCache(None)), []
    prompt = tuple(range(5, 45))
    for i, mix in enumerate([(1.0, 0.0), (0.0, 1.0), (1.0, 0.0), (0.0, 0.0)]):
        s.submit(_job(i, mix, prompt=prompt, cache_ns="ns"), out)
        _run(s, out)
    cached = {e.job_id: e.n_cache for e in out if isinstance(e, Started)}
    # the second vector misses, the first one's repeat hits, the base misses
    assert cached[0] == 0 and cached[1] == 0 and cached[2] > 30 and cached[3] == 0


def test_speculating_rows_keep_their_scales_and_their_output(adapted, tiny_model):
    """Drafts verified in one (B, k+1) forward, rows rolled back by their
    own counts: each row's scales ride along and the greedy text is the
    plain decode's, for a draft model that accepts everything (the adapted
    target itself) and an n-gram drafter."""
    from mlxcel_trio.engine.scheduler import Scheduler
    from mlxcel_trio.engine.speculative.draft_model import DraftModel
    from mlxcel_trio.engine.speculative.drafters import Chain, NgramSimple
    from mlxcel_trio.protocol.speculative import SpecRequest

    model, vocab = adapted
    prompts = [(5, 6, 7, 8, 5, 6, 7, 8, 5, 6), (9, 10, 11), (12, 13, 14, 15, 16)]
    mixes = [(1.0, 0.0), (0.0, 1.0), (0.5, 0.5)]

    def run(drafter):
        s = Scheduler(model, vocab, n_slots=3, n_ctx_slot=256, batch_size=64, n_adapters=2,
                      drafter=drafter)
        out: list = []
        for i, (p, mix) in enumerate(zip(prompts, mixes)):
            s.submit(Job(i, p, n_predict=20, sampling=GREEDY, ignore_eos=True, lora=mix,
                         speculative=SpecRequest(n_max=4) if drafter else None), out)
        _run(s, out)
        return {e.job_id: e.tokens for e in out if isinstance(e, Finished)}

    plain = run(None)
    assert run(Chain([NgramSimple(2, 4)])) == plain
    assert run(Chain([DraftModel(_load(tiny_model))])) == plain

"""Speculative decoding in the batch, driven through the scheduler step by
step (no threads, no HTTP): every output is compared with the same jobs run
without speculation, so a verify step that changed a single token fails."""

from __future__ import annotations

import math
import random

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_trio.protocol.records import Finished, Job, SamplingParams
from mlxcel_trio.protocol.speculative import SpecRequest

from .test_scheduler import of, run

GREEDY = SamplingParams(temperature=0.0)
N_SLOTS = 8


@pytest.fixture(scope="module")
def models(tiny_model, tiny_draft_model):
    from mlx_lm.utils import load_model

    from mlxcel_trio.engine.vocab import Vocab

    target, _ = load_model(tiny_model)
    draft, _ = load_model(tiny_draft_model)
    return target, draft, Vocab(tiny_model)


def _prompts(n: int, seed: int = 0) -> list[tuple[int, ...]]:
    rng = random.Random(seed)
    return [tuple(rng.randrange(2, 1500) for _ in range(rng.randrange(3, 40))) for _ in range(n)]


def _chain(kind: str, models):
    from mlxcel_trio.engine.speculative.draft_model import DraftModel
    from mlxcel_trio.engine.speculative.drafters import Chain, NgramSimple
    from mlxcel_trio.engine.speculative.ngram_cache import NgramCache
    from mlxcel_trio.engine.speculative.ngram_map import NgramMap, NgramMod

    target, draft, _ = models
    return {"ngram": lambda: Chain([NgramSimple(2, 8)]),
            "map-k": lambda: Chain([NgramMap(2, 6, 1, key_only=True)]),
            "map-k4v": lambda: Chain([NgramMap(1, 3, 1, key_only=False)]),
            "mod": lambda: Chain([NgramMod(2, 1, 8)]),
            "cache": lambda: Chain([NgramCache()]),
            "self": lambda: Chain([DraftModel(target)]),
            "draft": lambda: Chain([DraftModel(draft)])}[kind]()


def _run(models, jobs, drafter=None, n_ctx_slot=512, **kw) -> dict[int, Finished]:
    from mlxcel_trio.engine.scheduler import Scheduler

    target, _, vocab = models
    s = Scheduler(target, vocab, n_slots=N_SLOTS, n_ctx_slot=n_ctx_slot, batch_size=64,
                  drafter=drafter, **kw)
    out: list = []
    for j in jobs:
        s.submit(j, out)
    return {e.job_id: e for e in of(run(s, out, limit=5000), Finished)}


def _jobs(prompts, spec_every: int = 1, n_predict: int = 48, sampling=GREEDY,
          n_max: int = 6, **kw) -> list[Job]:
    return [Job(i + 1, p, n_predict=n_predict, sampling=sampling, ignore_eos=True,
                speculative=SpecRequest(n_max=n_max) if spec_every and i % spec_every == 0
                else None, **kw)
            for i, p in enumerate(prompts)]


# ---- per-row rollback --------------------------------------------------------

def test_rewind_drops_each_rows_own_count():
    from mlx_lm.models.cache import BatchKVCache, KVCache

    from mlxcel_trio.engine.speculative.rollback import rewind

    rng = np.random.default_rng(0)
    lengths, k1, drop = [5, 9, 2], 4, [0, 3, 4]
    rows = []
    for n in lengths:
        c = KVCache()
        c.update_and_fetch(*(mx.array(rng.standard_normal((1, 2, n, 8)), dtype=mx.float32)
                             for _ in range(2)))
        rows.append(c)
    batch = BatchKVCache.merge(rows)
    new_k = mx.array(rng.standard_normal((3, 2, k1, 8)), dtype=mx.float32)
    batch.update_and_fetch(new_k, new_k + 1)
    rewind([batch], drop)
    for i, (n, d) in enumerate(zip(lengths, drop)):
        got = batch.extract(i)
        want = mx.concatenate([rows[i].keys[..., :n, :], new_k[i:i + 1, :, :k1 - d]], axis=2)
        assert got.offset == n + k1 - d
        assert mx.array_equal(got.keys, want).item()
    assert batch.offset.tolist() == [n + k1 - d for n, d in zip(lengths, drop)]


# ---- lossless greedy ---------------------------------------------------------

@pytest.mark.parametrize("kind", ["ngram", "map-k", "map-k4v", "mod", "cache", "draft", "self"])
def test_greedy_output_is_unchanged_single_and_batched(models, kind):
    prompts = _prompts(N_SLOTS)
    if kind == "cache":
        # its context floors want an n-gram seen twice: repeat each prompt
        prompts = [p + p for p in prompts]
    plain = _run(models, _jobs(prompts[:1], spec_every=0))
    spec = _run(models, _jobs(prompts[:1]), _chain(kind, models))
    assert spec[1].tokens == plain[1].tokens
    # 8 streams, half of them speculating, in one batch
    plain = _run(models, _jobs(prompts, spec_every=0))
    spec = _run(models, _jobs(prompts, spec_every=2), _chain(kind, models))
    assert {i: f.tokens for i, f in spec.items()} == {i: f.tokens for i, f in plain.items()}
    drafted = [spec[i].timings.draft_n for i in sorted(spec)]
    assert all(d == 0 for d in drafted[1::2])          # plain rows never draft
    assert sum(drafted[::2]) > 0
    if kind == "self":
        # a draft identical to the target proposes the target's own choices
        t = [spec[i].timings for i in sorted(spec)][::2]
        assert sum(x.draft_n_accepted for x in t) >= 0.95 * sum(x.draft_n for x in t)


def test_a_draft_that_is_sometimes_wrong_is_verified(models):
    spec = _run(models, _jobs(_prompts(N_SLOTS, seed=3)), _chain("draft", models))
    t = [f.timings for f in spec.values()]
    drafted, kept = sum(x.draft_n for x in t), sum(x.draft_n_accepted for x in t)
    assert 0 < kept < drafted   # both accepted and rejected drafts happened


def test_stops_and_limits_cut_inside_an_accepted_run(models):
    prompts = _prompts(4, seed=5)
    plain = _run(models, _jobs(prompts, spec_every=0, n_predict=13))
    spec = _run(models, _jobs(prompts, n_predict=13), _chain("self", models))
    assert all(len(f.tokens) == 13 for f in spec.values())
    assert {i: f.tokens for i, f in spec.items()} == {i: f.tokens for i, f in plain.items()}
    # a context bound is honoured too: the row stops at the slot's last cell
    short = _run(models, _jobs(prompts[:1], n_predict=-1), _chain("self", models),
                 n_ctx_slot=64)
    ref = _run(models, _jobs(prompts[:1], spec_every=0, n_predict=-1), n_ctx_slot=64)
    assert short[1].tokens == ref[1].tokens and short[1].truncated


@pytest.mark.parametrize("extra", [{}, {"dry_multiplier": 2.0, "dry_allowed_length": 1}])
def test_penalties_and_logit_bias_apply_at_every_drafted_position(models, extra):
    params = SamplingParams(temperature=0.0, repeat_penalty=1.3, repeat_last_n=16,
                            logit_bias=((7, 5.0),), **extra)
    # prompts that repeat themselves, so DRY has sequences to penalize
    prompts = [p[:8] * 4 for p in _prompts(N_SLOTS, seed=7)]
    plain = _run(models, _jobs(prompts, spec_every=0, sampling=params))
    spec = _run(models, _jobs(prompts, sampling=params), _chain("self", models))
    assert {i: f.tokens for i, f in spec.items()} == {i: f.tokens for i, f in plain.items()}
    assert sum(f.timings.draft_n_accepted for f in spec.values()) > 0


# ---- sampling ----------------------------------------------------------------

def test_same_seed_gives_the_same_text(models):
    params = SamplingParams(temperature=0.9, top_k=40, seed=1234)
    prompts = _prompts(N_SLOTS, seed=11)
    plain = _run(models, _jobs(prompts, spec_every=0, sampling=params))
    spec = _run(models, _jobs(prompts, sampling=params), _chain("self", models))
    assert {i: f.tokens for i, f in spec.items()} == {i: f.tokens for i, f in plain.items()}
    assert sum(f.timings.draft_n_accepted for f in spec.values()) > 0


def test_sampled_tokens_follow_the_target_distribution(models):
    """Chi-square over the rank each drafted-position token has among the
    target's four candidates, against the target's own probabilities."""
    target, _, _ = models
    k, n_draws = 4, 100
    prompt = _prompts(1, seed=13)[0]
    jobs = [Job(i + 1, prompt, n_predict=4, ignore_eos=True,
                sampling=SamplingParams(temperature=1.0, top_k=k, top_p=1.0, min_p=0.0,
                                        seed=1000 + i),
                speculative=SpecRequest(n_max=3)) for i in range(n_draws)]
    spec = _run(models, jobs, _chain("draft", models))
    assert sum(f.timings.draft_n for f in spec.values()) > 0
    seqs = [list(prompt) + list(f.tokens) for f in spec.values()]
    logits = target(mx.array(seqs))[:, len(prompt):-1, :].astype(mx.float32)  # for tokens 2..4
    top = mx.argsort(-logits, axis=-1)[..., :k]
    p = mx.softmax(mx.take_along_axis(logits, top, axis=-1), axis=-1)
    chosen = mx.array([s[len(prompt) + 1:] for s in seqs])[..., None]
    rank = mx.argmax(top == chosen, axis=-1)
    assert mx.all(mx.any(top == chosen, axis=-1)).item()   # always one of the k
    observed = np.bincount(np.array(rank).ravel(), minlength=k)
    expected = np.array(p.reshape(-1, k).sum(axis=0))
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 16.27, (observed, expected)   # 3 degrees of freedom, p = 0.001
    assert not math.isnan(chi2)


# ---- the n-gram drafter --------------------------------------------------------

def test_ngram_simple_proposes_what_followed_the_latest_match():
    from mlxcel_trio.engine.speculative.drafters import Ask, NgramSimple

    h = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]
    d = NgramSimple(2, 3)
    assert d.may_propose(7, h)
    assert d.propose([Ask(7, h, 3, 8)]) == [[4, 5, 1]]     # after the match at 6..7
    assert d.propose([Ask(7, h, 9, 8)]) == [[]]            # (2, 9) never occurred
    # a continuation shorter than size_n proposes nothing, as upstream's
    assert NgramSimple(3, 2).propose([Ask(7, h, 3, 8)]) == [[]]
    # too little history for size_n + size_m + 1
    assert not NgramSimple(4, 4).may_propose(7, h[:9])


def test_draft_p_min_and_n_min_gate_proposals(models):
    prompts = _prompts(4, seed=17)

    def drafted(**bounds) -> int:
        jobs = [Job(i + 1, p, n_predict=32, sampling=GREEDY, ignore_eos=True,
                    speculative=SpecRequest(**bounds)) for i, p in enumerate(prompts)]
        return sum(f.timings.draft_n for f in _run(models, jobs, _chain("draft", models)).values())

    everything = drafted(n_max=4)
    assert 0 < drafted(n_max=4, p_min=0.6) < everything   # stops at unsure drafts
    assert drafted(n_max=4, n_min=5) == 0                    # every proposal too short


def test_ngram_map_k_remembers_how_much_was_accepted():
    from mlxcel_trio.engine.speculative.drafters import Ask
    from mlxcel_trio.engine.speculative.ngram_map import NgramMap

    h = [9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1]
    d = NgramMap(2, 3, 1, key_only=True)
    assert d.may_propose(1, h)
    assert d.propose([Ask(1, h, 2, 8)]) == [[3, 4, 5]]
    d.accepted(1, 3, 1)                                   # one of three kept
    assert d.propose([Ask(1, h, 2, 8)]) == [[3]]          # never more than that again
    assert d.propose([Ask(1, h, 7, 8)]) == [[]]           # (1, 7) never occurred


def test_ngram_map_k4v_needs_hits_and_a_dominant_continuation():
    from mlxcel_trio.engine.speculative.drafters import Ask
    from mlxcel_trio.engine.speculative.ngram_map import NgramMap

    h = [0, 5, 1, 1, 5, 1, 1, 5, 2, 2, 5, 1, 1, 0, 0, 0, 0]
    d = NgramMap(1, 2, 2, key_only=False)
    assert d.propose([Ask(1, h, 5, 8)]) == [[]]            # first hit: under min_hits
    # (1, 1) followed 5 three times and (2, 2) once: 3 >= 2 * 1, so it drafts
    assert d.propose([Ask(1, h, 5, 8)]) == [[1, 1]]
    h2 = [0, 5, 1, 1, 5, 2, 2, 5, 3, 3, 0, 0, 0, 0]
    d2 = NgramMap(1, 2, 1, key_only=False)
    assert d2.propose([Ask(1, h2, 5, 8)]) == [[]]          # nothing dominates


def test_ngram_mod_chains_lookups_and_forgets_after_poor_acceptance():
    from mlxcel_trio.engine.speculative.drafters import Ask
    from mlxcel_trio.engine.speculative.ngram_map import NgramMod

    h = [1, 2, 3, 4, 1, 2]
    d = NgramMod(2, 2, 4)
    assert d.may_propose(1, h)
    assert d.propose([Ask(1, h, 3, 8)]) == [[4, 1, 2, 3]]
    assert d.propose([Ask(1, h, 7, 8)]) == [[]]            # (2, 7) unknown: under n_min
    assert NgramMod(2, 5, 4).propose([Ask(1, h, 3, 8)]) == [[4, 1, 2, 3]]  # n_max first
    for _ in range(5):
        d.propose([Ask(1, h, 3, 8)])
        d.accepted(1, 4, 0)
    assert not d.may_propose(2, [7, 8]) and d.propose([Ask(2, [7, 8], 3, 8)]) == [[]]


def test_ngram_cache_drafts_from_context_then_dynamic_then_static():
    from mlxcel_trio.engine.speculative.drafters import Ask
    from mlxcel_trio.engine.speculative.ngram_cache import NgramCache, draft, update

    # the context table: (1, 2) was followed by 3 twice, so 3 is drafted and
    # the chain goes on through (2, 3) -> 4, (3, 4) -> 1 ... up to eight tokens
    d = NgramCache()
    assert d.propose([Ask(1, [1, 2, 3, 4, 1, 2, 3, 4, 1], 2, 8)]) == [[3, 4, 1, 2, 3, 4, 1, 2]]
    # only the tokens new since the last draft are counted, as upstream does:
    # the 1-gram (2,) -> 9 crosses the boundary and is never seen
    assert d.propose([Ask(1, [1, 2, 3, 4, 1, 2, 3, 4, 1, 2], 9, 8)]) == [[]]
    # one sample is under the lax floor for a 1-gram (2) but enough for a 4-gram
    ctx: dict = {}
    update(ctx, [5, 6, 7, 8, 9])
    assert draft([5, 6, 7, 8], ctx, {}, {}) == [9]
    assert draft([6], ctx, {}, {}) == []                    # too short to draft at all
    # the dynamic table needs the strict floors: 2 samples of a 4-gram at 100%
    dyn: dict = {}
    update(dyn, [1, 2, 3, 4, 5])
    assert draft([1, 2, 3, 4], {}, dyn, {}) == []
    update(dyn, [1, 2, 3, 4, 5])
    assert draft([1, 2, 3, 4], {}, dyn, {}) == [5]
    # the static table alone: two samples of the last two tokens, half agree
    assert draft([9, 3, 4], {}, {}, {(3, 4): {5: 1, 6: 1}}) == [5]
    assert draft([9, 3, 4], {}, {}, {(3, 4): {5: 1, 6: 1, 7: 1}}) == []
    assert draft([9, 3, 4], {}, {}, {(3, 4): {5: 1}}) == []
    # and it weights the context's candidates: the static table breaks a tie
    ctx = {(1, 2, 3, 4): {5: 1, 6: 1}}
    assert draft([1, 2, 3, 4], ctx, {}, {})[:1] == [5]
    assert draft([1, 2, 3, 4], ctx, {}, {(3, 4): {6: 1}})[:1] == [6]


def test_lookup_cache_files_round_trip_in_upstreams_layout(tmp_path):
    import struct

    from mlxcel_trio.protocol.lookup_cache import CacheFileError, dump_table, load_table

    table = {(3, 4): {5: 2, 6: 1}, (7,): {8: 4}, (1, 2, 3, 4): {9: 1}}
    data = dump_table(table)
    # one entry: four int32 ids padded with -1, the follower count, the pairs
    assert data[:36] == struct.pack("<4iiii", 3, 4, -1, -1, 2, 5, 2) + struct.pack("<ii", 6, 1)
    path = tmp_path / "static.bin"
    path.write_bytes(data)
    assert load_table(path) == table
    path.write_bytes(data[:-3])
    with pytest.raises(CacheFileError, match="bad follower count"):
        load_table(path)


def test_ngram_cache_drafts_from_a_static_file_through_the_scheduler(models):
    from mlxcel_trio.engine.speculative.drafters import Chain
    from mlxcel_trio.engine.speculative.ngram_cache import NgramCache

    prompts = _prompts(2, seed=31)
    plain = _run(models, _jobs(prompts, spec_every=0))
    # a static table that knows the plain run's every bigram -> next token
    static: dict = {}
    for f in plain.values():
        seq = [*prompts[f.job_id - 1], *f.tokens]
        for i in range(2, len(seq)):
            static.setdefault((seq[i - 2], seq[i - 1]), {})[seq[i]] = 2
    spec = _run(models, _jobs(prompts), Chain([NgramCache(static=static)]))
    assert {i: f.tokens for i, f in spec.items()} == {i: f.tokens for i, f in plain.items()}
    t = [f.timings for f in spec.values()]
    assert sum(x.draft_n_accepted for x in t) >= 0.8 * sum(x.draft_n for x in t) > 0


def test_ngram_proposals_are_capped_by_their_sizes_not_the_draft_models(models):
    # --spec-draft-n-max bounds the draft model only: ngram-simple proposes its size-m
    spec = _run(models, _jobs(_prompts(N_SLOTS), n_max=1), _chain("ngram", models))
    t = [f.timings for f in spec.values()]
    assert sum(x.draft_n for x in t) > sum(x.draft_rounds for x in t) > 0
    spec = _run(models, _jobs(_prompts(N_SLOTS), n_max=1), _chain("draft", models))
    t = [f.timings for f in spec.values()]
    assert sum(x.draft_n for x in t) == sum(x.draft_rounds for x in t) > 0


def test_context_shift_keeps_speculating_rows_identical(models):
    prompts = _prompts(3, seed=23)
    kw = {"n_ctx_slot": 48, "context_shift": True}
    plain = _run(models, _jobs(prompts, spec_every=0, n_predict=90), **kw)
    spec = _run(models, _jobs(prompts, n_predict=90), _chain("self", models), **kw)
    assert all(f.truncated for f in spec.values())          # the window did shift
    assert {i: f.tokens for i, f in spec.items()} == {i: f.tokens for i, f in plain.items()}
    assert sum(f.timings.draft_n_accepted for f in spec.values()) > 0


def test_cancelling_a_speculating_row_leaves_the_others_exact(models):
    from mlxcel_trio.engine.scheduler import Scheduler
    from mlxcel_trio.protocol.records import SlotFreed, TokenPiece

    target, _, vocab = models
    prompts = _prompts(4, seed=29)
    plain = _run(models, _jobs(prompts, spec_every=0))
    s = Scheduler(target, vocab, n_slots=N_SLOTS, n_ctx_slot=512, batch_size=64,
                  drafter=_chain("self", models))
    out: list = []
    for j in _jobs(prompts):
        s.submit(j, out)
    while sum(isinstance(e, TokenPiece) and e.job_id == 2 for e in out) < 5:
        s.step(out)
    s.cancel(2, out)
    assert any(isinstance(e, SlotFreed) and e.job_id == 2 and e.cancelled for e in out)
    while s.busy:
        s.step(out)
    done = {e.job_id: e for e in out if isinstance(e, Finished)}
    assert sorted(done) == [1, 3, 4]
    assert all(done[i].tokens == plain[i].tokens for i in done)


def test_a_stop_string_inside_an_accepted_run_ends_the_row_there(models):
    prompt = _prompts(1, seed=31)
    ref = _run(models, _jobs(prompt, spec_every=0))[1]
    word = ref.content[len(ref.content) // 2:len(ref.content) // 2 + 3]
    assert word.strip()
    plain = _run(models, _jobs(prompt, spec_every=0, stop=(word,)))[1]
    spec = _run(models, _jobs(prompt, stop=(word,)), _chain("self", models))[1]
    assert plain.stop_type == "word" and plain.stopping_word == word
    assert (spec.content, spec.tokens, spec.stop_type) == (plain.content, plain.tokens, "word")
    assert spec.timings.draft_n_accepted > 0


@pytest.mark.parametrize("kind", ["ngram", "map-k", "mod", "cache"])
def test_a_copied_passage_is_drafted_and_accepted(kind):
    """On a checkpoint whose greedy output follows a fixed token cycle
    (fixtures/forms.build_successor), a prompt holding a stretch of the
    cycle is copied by the answer: every n-gram drafter finds it and the
    target keeps nearly every proposal."""
    import json

    from mlx_lm.utils import load_model

    from fixtures.build import ensure
    from mlxcel_trio.engine.vocab import Vocab

    path = ensure("tiny-successor")
    model, _ = load_model(path)
    vocab_size = json.loads((path / "config.json").read_text())["vocab_size"]
    perm = np.random.default_rng(7).permutation(vocab_size)
    succ = np.empty_like(perm)
    succ[perm] = np.roll(perm, -1)
    passage = [int(perm[0])]
    for _ in range(39):
        passage.append(int(succ[passage[-1]]))
    prompt = (*passage, *passage[:4])          # the answer goes on with passage[4:]
    models = (model, None, Vocab(path))
    spec = _run(models, _jobs([prompt], n_predict=30), _chain(kind, models))
    assert list(spec[1].tokens) == passage[4:34]
    t = spec[1].timings
    assert t.draft_n_accepted >= 0.9 * t.draft_n > 0

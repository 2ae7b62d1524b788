"""The scheduler with a prompt cache: adoption, donation, truthful counts."""

from __future__ import annotations

import pytest

from mlxcel_trio.engine.prompt_cache import PromptCache
from mlxcel_trio.protocol.records import (
    Finished,
    Job,
    PromptProgress,
    SamplingParams,
    SlotAction,
    SlotTokens,
    Started,
    TokenPiece,
)

from .test_scheduler import of, run

GREEDY = SamplingParams(temperature=0.0, n_probs=3)
PROMPT = tuple(range(40, 140))


@pytest.fixture(scope="module")
def loaded(tiny_model):
    from mlx_lm.utils import load_model

    from mlxcel_trio.engine.vocab import Vocab

    model, _ = load_model(tiny_model)
    return model, Vocab(tiny_model)


def make(loaded, cache, slots=2):
    from mlxcel_trio.engine.scheduler import Scheduler

    model, vocab = loaded
    return Scheduler(model, vocab, n_slots=slots, n_ctx_slot=512, batch_size=32,
                     prompt_cache=cache)


def job(i, prompt=PROMPT, ns="raw", **kw):
    kw.setdefault("n_predict", 12)
    return Job(i, tuple(prompt), sampling=GREEDY, ignore_eos=True, cache_ns=ns, **kw)


def one(s, j):
    out = []
    s.submit(j, out)
    run(s, out)
    (fin,) = of(out, Finished, j.id)
    return fin, out


def trace(fin):
    return [(p.token, p.prob, p.top) for p in fin.probs]


def test_hit_equals_cold_and_reports_cache_n(loaded):
    cache = PromptCache(None)
    s = make(loaded, cache)
    cold, _ = one(s, job(1))
    assert cold.timings.cache_n == 0 and cold.timings.prompt_n == len(PROMPT)
    assert len(cache) == 1 and cache.nbytes > 0
    hit, out = one(s, job(2, return_progress=True))
    assert hit.timings.cache_n == len(PROMPT) - 1
    assert hit.timings.prompt_n == 1
    assert of(out, Started)[0].n_cache == len(PROMPT) - 1
    first = of(out, PromptProgress)[0]
    assert first.cache == first.processed == len(PROMPT) - 1
    assert trace(hit) == trace(cold)
    # a longer prompt sharing the prefix adopts it, and agrees with a cold run
    longer = PROMPT + tuple(range(300, 340))
    part, _ = one(s, job(3, longer))
    assert part.timings.cache_n >= len(PROMPT)
    # a hit donates too: its leaf (adopted prefix + suffix + output) replaces nothing
    # it does not cover, and its token record includes the adopted prefix
    leaves = [list(e.tokens) for e in cache._lru.values()]
    assert list(longer) + list(part.tokens) in leaves
    ref = make(loaded, None)
    cold_longer, _ = one(ref, job(4, longer))
    assert trace(part) == trace(cold_longer)


def test_opt_out_skips_lookup_and_donation(loaded):
    cache = PromptCache(None)
    s = make(loaded, cache)
    fin, _ = one(s, job(1, ns=None))
    assert fin.timings.cache_n == 0 and len(cache) == 0
    one(s, job(2))
    again, _ = one(s, job(3, ns=None))
    assert again.timings.cache_n == 0 and cache.hits == 0
    assert trace(again) == trace(fin)


def test_namespaces_are_isolated_in_the_scheduler(loaded):
    cache = PromptCache(None)
    s = make(loaded, cache)
    one(s, job(1, ns="chat"))
    fin, _ = one(s, job(2, ns="raw"))
    assert fin.timings.cache_n == 0


def test_donated_kv_matches_its_tokens(loaded):
    cache = PromptCache(None)
    s = make(loaded, cache)
    fin, _ = one(s, job(1, n_predict=5))
    (entry,) = cache._lru.values()
    assert list(entry.tokens) == list(PROMPT) + list(fin.tokens)
    assert all(c.offset == len(entry.tokens) for c in entry.layers)


def test_cancel_mid_generation_donates(loaded):
    cache = PromptCache(None)
    s = make(loaded, cache)
    out = []
    s.submit(job(1, n_predict=50), out)
    for _ in range(200):
        s.step(out)
        if len(of(out, TokenPiece)) >= 3:
            break
    assert len(of(out, TokenPiece)) >= 3
    s.cancel(1, out)
    assert len(cache) == 1
    fin, _ = one(s, job(2))
    assert fin.timings.cache_n == len(PROMPT) - 1


def test_slot_tokens_read_write_and_busy(loaded):
    s = make(loaded, PromptCache(None))
    fin, _ = one(s, job(1, n_predict=4))
    out = []
    s.slot_action(SlotAction(100, fin.id_slot), out)
    (st,) = of(out, SlotTokens)
    assert st.tokens == PROMPT + fin.tokens
    s.slot_action(SlotAction(101, fin.id_slot, ()), out)
    assert of(out, SlotTokens, 101)[0].previous == len(PROMPT) + 4
    s.slot_action(SlotAction(102, 7), out)
    assert out[-1].code == "invalid_slot"
    s.submit(job(2, n_predict=30, id_slot=0), out)
    s.slot_action(SlotAction(103, 0), out)
    assert out[-1].code == "slot_busy"
    run(s, out)


def test_restore_refills_the_cache_and_keeps_the_stream(loaded):
    cache = PromptCache(None)
    s = make(loaded, cache)
    out = []
    s.slot_action(SlotAction(200, 1, PROMPT, "raw"), out)
    assert of(out, Started)[0].id_slot == 1      # the slot re-evaluates the tokens
    s.slot_action(SlotAction(201, 1), out)
    assert out[-1].code == "slot_busy"    # busy meanwhile
    run(s, out)
    assert len(cache) == 1
    s.slot_action(SlotAction(202, 1), out)
    assert of(out, SlotTokens, 202)[0].tokens == PROMPT  # the refill's own token not added
    fin, _ = one(s, job(3, PROMPT + (7, 8)))
    assert fin.timings.cache_n in (len(PROMPT), len(PROMPT) + 1)
    # without a namespace a restore only sets the stream
    s2, out2 = make(loaded, PromptCache(None)), []
    s2.slot_action(SlotAction(300, 0, PROMPT), out2)
    assert not of(out2, Started) and not s2.busy


def test_penalties_see_the_adopted_prefix_as_history(loaded):
    """Repetition and DRY penalties read the prompt as history: a hit must
    hand them the same history a cold prefill does."""
    params = SamplingParams(temperature=0.0, n_probs=3, repeat_penalty=1.5, repeat_last_n=256,
                            presence_penalty=0.5, dry_multiplier=0.8, dry_allowed_length=1)
    prompt = tuple(range(40, 60)) * 5

    def pj(i, ns):
        return Job(i, prompt, n_predict=12, sampling=params, ignore_eos=True, cache_ns=ns)

    s = make(loaded, PromptCache(None))
    cold, _ = one(s, pj(1, None))
    one(s, pj(2, "raw"))
    hit, _ = one(s, pj(3, "raw"))
    assert hit.timings.cache_n == len(prompt) - 1
    assert trace(hit) == trace(cold)


def test_clear_prompt_cache_drops_every_entry(loaded):
    from mlxcel_trio.protocol.records import CacheStats

    cache = PromptCache(None)
    s = make(loaded, cache)
    one(s, job(1))
    out = []
    s.clear_prompt_cache(out)
    assert len(cache) == 0 and of(out, CacheStats)[-1].bytes == 0
    fin, _ = one(s, job(2))
    assert fin.timings.cache_n == 0

"""Speculative decoding on the architectures whose caches cannot simply be
trimmed: tiny-swa (gemma3_text, a 32-token sliding window that the runs
below rotate many times) and tiny-hybrid (lfm2, recurrent conv state).
Every output is compared with the same jobs run without speculation, and
an oracle drafter that knows the plain answer but errs at a seeded place
makes every acceptance count happen, so a rollback that is off by one
position, or that leaves a rejected token in a window or a state, fails."""

from __future__ import annotations

import random

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_trio.protocol.records import Finished, Job, SamplingParams
from mlxcel_trio.protocol.speculative import SpecRequest

from .test_scheduler import of, run
from .test_speculative import _prompts

GREEDY = SamplingParams(temperature=0.0)
N_SLOTS = 6
N_PREDICT = 70   # with the prompts, well past the 32-token window


@pytest.fixture(scope="module", params=["tiny-swa", "tiny-hybrid"])
def models(request, tiny_draft_model):
    from mlx_lm.utils import load_model

    from fixtures.build import ensure
    from mlxcel_trio.engine.vocab import Vocab

    path = ensure(request.param)
    target, _ = load_model(path)
    draft, _ = load_model(tiny_draft_model)
    return target, draft, Vocab(path)


def _jobs(prompts, spec_every: int = 1, n_max: int = 6) -> list[Job]:
    return [Job(i + 1, p, n_predict=N_PREDICT, sampling=GREEDY, ignore_eos=True,
                speculative=SpecRequest(n_max=n_max) if spec_every and i % spec_every == 0
                else None)
            for i, p in enumerate(prompts)]


def _run(models, jobs, drafter=None, **kw) -> dict[int, Finished]:
    from mlxcel_trio.engine.scheduler import Scheduler

    target, _, vocab = models
    s = Scheduler(target, vocab, n_slots=N_SLOTS, n_ctx_slot=512, batch_size=64,
                  drafter=drafter, **kw)
    assert (s._drafter is None) == (drafter is None)   # not switched off
    out: list = []
    for j in jobs:
        s.submit(j, out)
    return {e.job_id: e for e in of(run(s, out, limit=5000), Finished)}


class Oracle:
    """Proposes the plain run's own continuation, wrong from a seeded
    position on (possibly the first, possibly none)."""

    def __init__(self, answers: dict[tuple[int, ...], tuple[int, ...]], n_vocab: int) -> None:
        self.answers, self.n_vocab = answers, n_vocab
        self.rng = random.Random(5)

    def may_propose(self, uid, history):
        return True

    def propose(self, asks):
        out = []
        for a in asks:
            prompt = next(p for p in self.answers if tuple(a.history[:len(p)]) == p)
            done = len(a.history) - len(prompt) + 1      # the pending token is the answer's
            right = list(self.answers[prompt][done:done + a.n_max])
            cut = self.rng.randrange(len(right) + 1)
            out.append(right[:cut] + [(t + 1) % self.n_vocab for t in right[cut:]])
        return out

    def accepted(self, uid, n_drafted, n_accepted):
        pass

    def forget(self, uid):
        pass

    def clear(self):
        pass


def _chain(kind, models, answers=None):
    from mlxcel_trio.engine.speculative.draft_model import DraftModel
    from mlxcel_trio.engine.speculative.drafters import Chain, NgramSimple

    target, draft, vocab = models
    # lookups of one token: tiny-hybrid's greedy text repeats no longer n-gram
    return {"ngram": lambda: Chain([NgramSimple(1, 4)]),
            "draft": lambda: Chain([DraftModel(draft)]),
            "oracle": lambda: Chain([Oracle(answers, vocab.n_vocab)])}[kind]()


@pytest.mark.parametrize("kind", ["oracle", "ngram", "draft"])
def test_greedy_output_is_unchanged_single_and_batched(models, kind):
    prompts = _prompts(N_SLOTS)
    plain = _run(models, _jobs(prompts, spec_every=0))
    answers = {p: tuple(plain[i + 1].tokens) for i, p in enumerate(prompts)}
    spec = _run(models, _jobs(prompts[:1]), _chain(kind, models, answers))
    assert spec[1].tokens == plain[1].tokens
    # half the rows speculating beside plain ones, in one batch
    spec = _run(models, _jobs(prompts, spec_every=2), _chain(kind, models, answers))
    assert {i: f.tokens for i, f in spec.items()} == {i: f.tokens for i, f in plain.items()}
    t = [spec[i].timings for i in sorted(spec)]
    assert all(x.draft_n == 0 for x in t[1::2])
    assert sum(x.draft_n for x in t[::2]) > 0
    if kind == "oracle":
        # rejected and accepted drafts both happened, many times over
        kept, drafted = sum(x.draft_n_accepted for x in t), sum(x.draft_n for x in t)
        assert 0.2 * drafted < kept < 0.9 * drafted


def test_rollback_over_a_quantized_global_layer_beside_windows_or_states(models):
    """-ctk q8_0: tiny-swa's global layer (and tiny-hybrid's attention
    layer) is stored quantized, its windows (states) stay as they are;
    verify steps roll each kind back in one batch, so speculating rows
    still give the plain q8_0 run's tokens."""
    prompts = _prompts(N_SLOTS, seed=1)
    q8 = {"kv_types": ("q8_0", "q8_0")}
    plain = _run(models, _jobs(prompts, spec_every=0), **q8)
    answers = {p: tuple(plain[i + 1].tokens) for i, p in enumerate(prompts)}
    drafter = _chain("oracle", models, answers)
    spec = _run(models, _jobs(prompts, spec_every=2), drafter, **q8)
    assert {i: f.tokens for i, f in spec.items()} == {i: f.tokens for i, f in plain.items()}
    t = [spec[i].timings for i in sorted(spec)]
    kept, drafted = sum(x.draft_n_accepted for x in t), sum(x.draft_n for x in t)
    assert 0.2 * drafted < kept < 0.9 * drafted
    if any(type(c).__name__ == "RotatingKVCache" for c in models[0].make_cache()):
        # on tiny-swa q8_0 moves greedy tokens (on tiny-hybrid's one attention
        # layer it does not, for these prompts): the quantized store applies
        f16 = _run(models, _jobs(prompts, spec_every=0))
        assert {i: f.tokens for i, f in f16.items()} != {i: f.tokens for i, f in plain.items()}


@pytest.mark.parametrize("steps", [1, 5])
def test_a_verify_step_on_a_rotated_window_sees_what_one_token_steps_see(models, steps):
    """A short row left-padded in a full, rotated window: the multi-token
    forward of a verify step gives each position the logits one-token
    steps give (prepare_verify; without it mlx-lm's mask hides one more
    cached position of the padded row)."""
    from mlx_lm.models.cache import make_prompt_cache

    from mlxcel_trio.engine.speculative.rollback import prepare_verify

    target, _, _ = models
    rows = [list(range(100, 123)), list(range(300, 339))]   # 23 and 39 tokens
    caches = []
    for r in rows:
        c = make_prompt_cache(target)
        target(mx.array([r]), cache=c)
        caches.append(c)
    batch = [type(a).merge([a, b]) for a, b in zip(*caches)]
    for s in range(steps):
        target(mx.array([[50 + s], [60 + s]]), cache=batch)
        rows[0].append(50 + s)
        rows[1].append(60 + s)
    fed = [[7, 8, 9], [5, 6, 4]]
    prepare_verify(batch)
    got = np.array(target(mx.array(fed), cache=batch))
    for i in range(2):
        for j in range(3):
            want = np.array(target(mx.array([rows[i] + fed[i][:j + 1]]))[0, -1])
            assert np.allclose(got[i, j], want, atol=1e-3), (i, j)


def test_lora_scale_entry_rides_through_the_replay(models):
    """The replay forward takes the cache list as the batch holds it, the
    LoRA scale entry included (engine/lora.AdapterRows)."""
    from mlxcel_trio.engine.lora import AdapterRows
    from mlxcel_trio.engine.speculative.rollback import roll_back, save

    target, _, _ = models
    from mlx_lm.models.cache import make_prompt_cache

    rows = []
    for n in (5, 9):
        c = make_prompt_cache(target)
        target(mx.array([list(range(3, 3 + n))]), cache=c)
        rows.append(c)
    merged = [type(layers[0]).merge(list(layers)) for layers in zip(*rows)]
    batch = [*merged, AdapterRows([(), ()])]

    def adapted(inputs, cache):
        assert isinstance(cache[-1], AdapterRows)
        return target(inputs, cache=cache[:-1])

    saved = save(batch)
    adapted(mx.array([[20, 21, 22], [30, 31, 32]]), batch)
    roll_back(adapted, batch, saved, 3, [[20], [30, 31]])
    logits = target(mx.array([[40], [41]]), cache=batch[:-1])
    # the same two rows fed only what they kept
    ref = []
    for n, kept, nxt in ((5, [20], 40), (9, [30, 31], 41)):
        c = make_prompt_cache(target)
        target(mx.array([list(range(3, 3 + n)) + kept]), cache=c)
        ref.append(target(mx.array([[nxt]]), cache=c)[0, -1])
    assert np.allclose(np.array(logits[:, -1]), np.array(mx.stack(ref)), atol=1e-4)

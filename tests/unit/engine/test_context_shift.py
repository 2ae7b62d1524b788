"""Context shift: upstream's retained-token arithmetic (pure), and the
scheduler applying it to a real model (greedy, so every step is checkable
against a fresh evaluation of the retained window)."""

from __future__ import annotations

import pytest

from mlxcel_trio.engine import context_shift
from mlxcel_trio.engine.context_shift import retained, window
from mlxcel_trio.protocol.records import Finished, Job, SamplingParams, TokenPiece
from mlxcel_trio.server.http.errors import ApiError


# (n_tokens, n_ctx, n_keep, n_discard, n_prompt, add_bos) -> (keep, discard),
# worked by hand from server-context.cpp's pre_decode.
@pytest.mark.parametrize("args, expected", [
    ((31, 32, 0, 0, 10, False), (0, 15)),      # default: keep nothing, half of 31
    ((31, 32, 0, 0, 10, True), (1, 15)),       # BOS: one cell pinned, half of 30
    ((31, 32, 4, 0, 10, False), (4, 13)),      # --keep 4: half of 27 (truncated)
    ((31, 32, -1, 0, 10, False), (10, 10)),    # -1: the whole prompt
    ((31, 32, -1, 0, 10, True), (11, 10)),     # -1 with BOS: prompt + 1
    ((31, 32, 100, 0, 10, False), (28, 1)),    # clamped to n_ctx - 4; n_left 3 -> 1
    ((31, 32, 2, 5, 10, False), (2, 5)),       # explicit n_discard
    ((31, 32, 2, 1000, 10, False), (2, 28)),   # n_discard clamped to n_left - 1
    ((63, 64, -1, 7, 50, True), (51, 7)),
])
def test_window_is_upstreams_arithmetic(args, expected):
    assert window(*args) == expected


def test_retained_drops_the_discarded_span():
    toks = list(range(10))
    assert retained(toks, 2, 3) == [0, 1, 5, 6, 7, 8, 9]
    assert retained(toks, 0, 5) == [5, 6, 7, 8, 9]
    assert retained(toks, 4, 0) == toks


GREEDY = SamplingParams(temperature=0.0)
MAX_STEPS = 200   # far more than any job here needs: a stalled scheduler fails, never hangs


def step_until(s, out: list, done, what: str) -> None:
    """Step the scheduler until `done()`; fail naming `what` after MAX_STEPS."""
    for _ in range(MAX_STEPS):
        if done():
            return
        s.step(out)
    raise AssertionError(f"{what}: not reached within {MAX_STEPS} scheduler steps")


@pytest.fixture(scope="module")
def loaded(tiny_model):
    from mlx_lm.utils import load_model

    from mlxcel_trio.engine.vocab import Vocab

    model, _ = load_model(tiny_model)
    return model, Vocab(tiny_model)


def _greedy_next(model, tokens):
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array([tokens]), cache=cache)
    return int(mx.argmax(logits[0, -1]).item())


def _run(loaded, monkeypatch, *, n_ctx, prompt, n_predict, n_keep=0, n_discard=0,
         shift=True, sampling=GREEDY):
    from mlxcel_trio.engine.scheduler import Scheduler

    model, vocab = loaded
    shifts = []
    real = context_shift.retained

    def spy(tokens, keep, discard):
        kept = real(tokens, keep, discard)
        shifts.append((list(tokens), keep, discard, kept))
        return kept

    monkeypatch.setattr(context_shift, "retained", spy)
    s = Scheduler(model, vocab, n_slots=1, n_ctx_slot=n_ctx, batch_size=16,
                  context_shift=shift)
    out: list = []
    s.submit(Job(1, tuple(prompt), n_predict=n_predict, sampling=sampling, ignore_eos=True,
                 n_keep=n_keep, n_discard=n_discard), out)
    for _ in range(5000):
        if not s.busy:
            break
        s.step(out)
    (fin,) = [e for e in out if isinstance(e, Finished)]
    return fin, shifts, out


@pytest.mark.parametrize("n_keep, n_discard", [(0, 0), (4, 0), (-1, 0), (3, 5), (100, 0)])
def test_generation_runs_past_the_bound_with_upstreams_window(loaded, monkeypatch,
                                                              n_keep, n_discard):
    n_ctx, prompt = 24, [5, 9, 13, 17, 21, 25, 29, 33]
    fin, shifts, out = _run(loaded, monkeypatch, n_ctx=n_ctx, prompt=prompt, n_predict=60,
                            n_keep=n_keep, n_discard=n_discard)
    assert len(fin.tokens) == 60 and fin.stop_type == "limit" and fin.truncated
    assert shifts, "no shift happened"
    history = [*prompt, *fin.tokens]
    for kv, keep, discard, kept in shifts:
        # the shift happens exactly when decoding the next token would fill
        # the last cell, over the tokens actually in the KV (a contiguous
        # stretch of the history after the previous shifts)
        assert len(kv) + 1 == n_ctx
        assert (keep, discard) == window(len(kv), n_ctx, n_keep, n_discard, len(prompt), False)
        assert kept == kv[:keep] + kv[keep + discard:]
    # the first shift's KV is the plain history
    assert shifts[0][0] == history[:n_ctx - 1]
    # greedy: each token right after a shift is what a fresh evaluation of the
    # retained window plus the pending token predicts
    model = loaded[0]
    pos = n_ctx - 1 - len(prompt)   # index in fin.tokens of the first pending token
    kept = shifts[0][3]
    context = kept + [fin.tokens[pos]]
    # up to the next shift, the continuation is greedy over that window
    n_until_next = n_ctx - 1 - len(context)
    for k in range(1, n_until_next + 1):
        assert fin.tokens[pos + k] == _greedy_next(model, context), k
        context.append(fin.tokens[pos + k])
    assert "".join(p.text for p in out if isinstance(p, TokenPiece)) == fin.content


def test_without_shift_the_bound_stops_and_truncates(loaded, monkeypatch):
    fin, shifts, _ = _run(loaded, monkeypatch, n_ctx=24, prompt=[5] * 8, n_predict=60,
                          shift=False)
    assert len(fin.tokens) == 16 and fin.truncated and fin.stop_type == "limit"
    assert not shifts


def test_shifted_chain_sampling_keeps_its_random_stream(loaded, monkeypatch):
    """A seeded stochastic job shifted twice reproduces itself exactly."""
    sampling = SamplingParams(temperature=1.0, seed=7, repeat_penalty=1.3, repeat_last_n=16)
    a, sa, _ = _run(loaded, monkeypatch, n_ctx=20, prompt=[5, 6, 7], n_predict=50,
                    sampling=sampling)
    b, sb, _ = _run(loaded, monkeypatch, n_ctx=20, prompt=[5, 6, 7], n_predict=50,
                    sampling=sampling)
    assert len(sa) >= 2 and a.tokens == b.tokens


# -- --no-cont-batching -------------------------------------------------------

def _interleaving(loaded, cont_batching: bool) -> tuple[list, list]:
    """Job 1 decodes; job 2 arrives after job 1's first token.  Returns the
    order of (job, event) pairs and job 2's first-token index in it."""
    from mlxcel_trio.engine.scheduler import Scheduler

    model, vocab = loaded
    s = Scheduler(model, vocab, n_slots=2, n_ctx_slot=128, batch_size=16,
                  cont_batching=cont_batching)
    out: list = []
    s.submit(Job(1, (5, 6, 7), n_predict=12, sampling=GREEDY, ignore_eos=True), out)
    step_until(s, out, lambda: any(isinstance(e, TokenPiece) for e in out), "job 1's first token")
    s.submit(Job(2, (8, 9, 10, 11), n_predict=3, sampling=GREEDY, ignore_eos=True), out)
    for _ in range(200):
        if not s.busy:
            break
        s.step(out)
    order = [(e.job_id, type(e).__name__) for e in out
             if isinstance(e, (TokenPiece, Finished))]
    return order, out


def test_no_cont_batching_holds_new_prompts_while_a_slot_decodes(loaded):
    order, out = _interleaving(loaded, cont_batching=False)
    first_2 = order.index((2, "TokenPiece"))
    assert order.index((1, "Finished")) < first_2, order
    # the slot is still taken at once (upstream assigns it at launch)
    from mlxcel_trio.protocol.records import Started
    assert [e.id_slot for e in out if isinstance(e, Started)] == [0, 1]
    fins = {e.job_id: e for e in out if isinstance(e, Finished)}
    assert len(fins[1].tokens) == 12 and len(fins[2].tokens) == 3


def test_cont_batching_interleaves(loaded):
    order, _ = _interleaving(loaded, cont_batching=True)
    assert order.index((2, "TokenPiece")) < order.index((1, "Finished")), order


def test_no_cont_batching_still_batches_prompts_that_arrive_together(loaded):
    from mlxcel_trio.engine.scheduler import Scheduler

    model, vocab = loaded
    s = Scheduler(model, vocab, n_slots=2, n_ctx_slot=128, batch_size=16, cont_batching=False)
    out: list = []
    for i in (1, 2):
        s.submit(Job(i, (5, 6, 7 + i), n_predict=6, sampling=GREEDY, ignore_eos=True), out)
    for _ in range(200):
        if not s.busy:
            break
        s.step(out)
    order = [(e.job_id, type(e).__name__) for e in out if isinstance(e, (TokenPiece, Finished))]
    # both decode side by side: job 2's first token precedes job 1's end
    assert order.index((2, "TokenPiece")) < order.index((1, "Finished")), order


def test_a_held_prompt_cancelled_never_runs(loaded):
    from mlxcel_trio.protocol.records import SlotFreed
    from mlxcel_trio.engine.scheduler import Scheduler

    model, vocab = loaded
    s = Scheduler(model, vocab, n_slots=2, n_ctx_slot=128, batch_size=16, cont_batching=False)
    out: list = []
    s.submit(Job(1, (5, 6, 7), n_predict=10, sampling=GREEDY, ignore_eos=True), out)
    step_until(s, out, lambda: any(isinstance(e, TokenPiece) for e in out), "job 1's first token")
    s.submit(Job(2, (8, 9), n_predict=10, sampling=GREEDY, ignore_eos=True), out)
    s.step(out)
    s.cancel(2, out)
    for _ in range(100):
        if not s.busy:
            break
        s.step(out)
    assert not [e for e in out if isinstance(e, TokenPiece) and e.job_id == 2]
    assert [e.cancelled for e in out if isinstance(e, SlotFreed) and e.job_id == 2] == [True]


def test_a_shared_prompt_is_never_shifted(loaded):
    from mlxcel_trio.protocol.records import Failed, SlotFreed
    from mlxcel_trio.engine.scheduler import Scheduler

    model, vocab = loaded
    s = Scheduler(model, vocab, n_slots=1, n_ctx_slot=16, batch_size=16, context_shift=True)
    out: list = []
    s.submit(Job(1, (5, 6, 7), n_predict=40, sampling=GREEDY, ignore_eos=True,
                 shared_prompt=True), out)
    s.submit(Job(2, (5, 6, 7), n_predict=4, sampling=GREEDY, ignore_eos=True), out)
    for _ in range(200):
        if not s.busy:
            break
        s.step(out)
    (f,) = [e for e in out if isinstance(e, Failed)]
    assert f.job_id == 1
    assert ApiError.from_failed(f).message == "context shift cannot be used for shared prompt"
    assert [e.job_id for e in out if isinstance(e, SlotFreed)] == [1, 2]   # 2 still ran
    assert len([e for e in out if isinstance(e, Finished) and e.job_id == 2]) == 1



def test_processors_see_the_whole_history_across_shifts(loaded, monkeypatch):
    """Penalties, DRY and grammars read the context mlx-lm hands the row's
    processor: across shifts it must stay the whole history (prompt plus
    every token so far), as upstream's sampler never sees a shift."""
    from mlxcel_trio.engine.samplers.batch import Row

    seen: list[list[int]] = []
    real = Row.process

    def spy(self, context, logits):
        seen.append(context.tolist())
        return real(self, context, logits)

    monkeypatch.setattr(Row, "process", spy)
    sampling = SamplingParams(temperature=0.0, repeat_penalty=1.3, repeat_last_n=20)
    prompt = [5, 9, 13, 17, 21, 25, 29, 33]
    fin, shifts, _ = _run(loaded, monkeypatch, n_ctx=20, prompt=prompt, n_predict=40,
                          sampling=sampling)
    assert len(shifts) >= 2
    history = [*prompt, *fin.tokens]
    # one processor call per drawn token; call k sees the history before draw k
    assert len(seen) >= len(fin.tokens)
    for k, context in enumerate(seen[:len(fin.tokens)]):
        assert context == history[:len(prompt) + k], k


def test_a_stop_word_on_the_last_cell_reports_limit(loaded, monkeypatch):
    """Upstream checks the context bound after the stop strings, so a stop
    string completed by the token that fills the slot reports "limit"
    (with truncated), keeping the stopping word."""
    prompt = (17,) * 6   # its last piece (" than") occurs nowhere earlier
    fin, _, out = _run(loaded, monkeypatch, n_ctx=24, prompt=prompt, n_predict=-1,
                       shift=False)
    pieces = [p.text for p in out if isinstance(p, TokenPiece)]
    last = pieces[-1]
    if not last.strip() or "".join(pieces[:-1]).find(last) != -1:
        pytest.skip("the last piece is not a unique stop string on this fixture")
    from mlxcel_trio.engine.scheduler import Scheduler

    model, vocab = loaded
    s = Scheduler(model, vocab, n_slots=1, n_ctx_slot=24, batch_size=16)
    out2: list = []
    s.submit(Job(1, prompt, n_predict=-1, sampling=GREEDY, ignore_eos=True,
                 stop=(last,)), out2)
    step_until(s, out2, lambda: not s.busy, "the job's end")
    (fin2,) = [e for e in out2 if isinstance(e, Finished)]
    assert fin2.tokens == fin.tokens
    assert (fin2.stop_type, fin2.truncated, fin2.stopping_word) == ("limit", True, last)
    assert fin2.content == fin.content[:len(fin.content) - len(last)]

"""Unified KV's accounting (engine/kv_budget.py), pure and in the scheduler
driven step by step: a lone sequence may hold the whole context, a job waits
until the live sequences leave room for its prompt, and when they outgrow
the budget every one of them fails as upstream's do."""

from __future__ import annotations

from mlxcel_trio.engine.kv_budget import KvBudget, total_held
from mlxcel_trio.protocol.records import (
    Failed,
    Finished,
    SlotAction,
    SlotFreed,
    SlotTokens,
    Started,
)
from tests.unit.engine.test_scheduler import job, loaded, of, run  # noqa: F401 (fixture)

N_CTX = 64


def unified(loaded, slots=4, n_ctx=N_CTX, **kw):
    from mlxcel_trio.engine.scheduler import Scheduler

    model, vocab = loaded
    return Scheduler(model, vocab, n_slots=slots, n_ctx_slot=n_ctx, batch_size=64,
                     kv_budget=n_ctx, **kw)


def stepped(s, out, limit=2000):
    """Run to the end: a step that starts with more than the budget held
    computes nothing and fails every live job instead."""
    for _ in range(limit):
        if not s.busy:
            return out
        before, n_events = s.n_held, len(out)
        s.step(out)
        if before > N_CTX:
            assert {e.code for e in out[n_events:] if isinstance(e, Failed)} == \
                {"context_exceeded"}, "a step ran with more than the budget held"
    raise AssertionError("scheduler did not drain")


def test_the_budget_arithmetic():
    b = KvBudget(N_CTX)
    assert b.admits(40, 24) and not b.admits(40, 25)
    assert not b.overflows(N_CTX) and b.overflows(N_CTX + 1)
    assert total_held([3, 4, 5]) == 12 and total_held([]) == 0


def test_a_lone_sequence_holds_the_whole_context(loaded):
    # an even share of 64 over 4 slots would be 16: this prompt could not start
    s, out = unified(loaded), []
    s.submit(job(1, prompt=[5] * 40, n_predict=-1), out)
    stepped(s, out)
    (fin,) = of(out, Finished)
    assert len(fin.tokens) == N_CTX - 40 and fin.truncated and fin.stop_type == "limit"
    assert not of(out, Failed)


def test_a_prompt_that_would_overfill_the_budget_waits_its_turn(loaded):
    s, out = unified(loaded), []
    s.submit(job(1, prompt=[5] * 40, n_predict=20), out)
    s.submit(job(2, prompt=[6] * 30, n_predict=5), out)   # 40 + 30 > 64: no room for 2
    s.submit(job(3, prompt=[7] * 3, n_predict=5), out)    # fits, but does not overtake 2
    assert [e.job_id for e in of(out, Started)] == [1]
    assert s.n_held == 40
    s.step(out)
    while not of(out, SlotFreed):
        assert [e.job_id for e in of(out, Started)] == [1] and s.n_held <= N_CTX
        s.step(out)
    # 1's end frees the room: 2 and 3 start together, after it
    first_freed = next(i for i, e in enumerate(out) if isinstance(e, SlotFreed))
    assert [e.job_id for e in of(out[first_freed:], Started)] == [2, 3]
    stepped(s, out)
    assert {f.job_id: len(f.tokens) for f in of(out, Finished)} == {1: 20, 2: 5, 3: 5}
    assert not of(out, Failed)


def test_outgrowing_the_budget_fails_every_live_job(loaded):
    # job 1 ends at 3 + 5 tokens; then 2..4 grow 3 + n each past 64 together
    s, out = unified(loaded), []
    for i, n in enumerate((5, 30, 30, 30), start=1):
        s.submit(job(i, prompt=(5, 6, 7), n_predict=n), out)
    s.submit(job(5, prompt=[8] * 50, n_predict=4), out)   # waits for room meanwhile
    stepped(s, out)
    assert [f.job_id for f in of(out, Finished)] == [1, 5]
    failed = of(out, Failed)
    assert sorted(f.job_id for f in failed) == [2, 3, 4]
    assert {(f.code, f.kind) for f in failed} == {("context_exceeded", "")}
    # each drew tokens while the step feeding them fit: the n-th was drawn by
    # a step of 3 * (3 + n - 1) <= 64 tokens, the next would need 3 * (3 + n) > 64
    n = N_CTX // 3 - 3 + 1
    pieces = {j: sum(1 for e in out if getattr(e, "job_id", None) == j
                     and type(e).__name__ == "TokenPiece") for j in (2, 3, 4)}
    assert set(pieces.values()) == {n}, pieces
    # freed (not cancelled), and the waiting job ran in the room they left
    assert {e.job_id for e in of(out, SlotFreed) if not e.cancelled} == {1, 2, 3, 4, 5}
    started_5 = next(i for i, e in enumerate(out) if isinstance(e, Started) and e.job_id == 5)
    assert all(out.index(f) < started_5 for f in failed)


def test_the_split_keeps_each_slot_to_its_share(loaded):
    # no budget: 4 slots of 16, none of them fails, each stops at its bound
    from mlxcel_trio.engine.scheduler import Scheduler

    model, vocab = loaded
    s, out = Scheduler(model, vocab, n_slots=4, n_ctx_slot=16, batch_size=64), []
    for i in range(1, 5):
        s.submit(job(i, prompt=(5, 6, 7), n_predict=30), out)
    run(s, out)
    assert [len(f.tokens) for f in of(out, Finished)] == [13] * 4
    assert not of(out, Failed)


def _retained(s, slot, out):
    s.slot_action(SlotAction(-99, slot), out)
    return of(out, SlotTokens)[-1].tokens


def test_a_start_clears_idle_slots_under_unified_kv(loaded):
    for clear in (True, False):
        s, out = unified(loaded, slots=2, clear_idle=clear), []
        s.submit(job(1, prompt=(5, 6, 7), n_predict=2, id_slot=0), out)
        run(s, out)
        assert len(_retained(s, 0, out)) == 5
        s.submit(job(2, prompt=(8, 9), n_predict=2, id_slot=1), out)
        run(s, out)
        assert len(_retained(s, 0, out)) == (0 if clear else 5)
        assert len(_retained(s, 1, out)) == 4   # the slot that served the job keeps its own

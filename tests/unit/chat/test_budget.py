"""chat/budget.py: thinking tokens are counted from the opener (or from the
start when the prompt left the block open); at the budget the message and
the closing marker are forced one token at a time; a block the model closes
itself is left alone; an inner grammar's mask applies otherwise.
Realtime control arrives as the constraint's force_end(), which the engine
calls between steps when a ForceEnd command names the job."""

from __future__ import annotations

import numpy as np

from mlxcel_trio.chat.budget import BudgetGrammar, utf8_complete

START, END, MSG = 10, 11, (20, 21)
N_PROMPT = 3


def grammar(budget, open_at_start=False, inner=None, forced=MSG + (END,), control=False,
            ends=((END,),), piece=None):
    return BudgetGrammar(inner, n_vocab=32, budget=budget, start_ids=(START,), end_seqs=ends,
                         forced=forced, open_at_start=open_at_start, control=control,
                         piece=piece)


def run(g, generated, at=None):
    """The mask before each draw, as the engine asks: history = prompt + drawn.
    `at`: {draw index: callable(constraint)} run just before that draw's mask
    is asked (the engine applies commands between steps)."""
    c = g.start(N_PROMPT)
    history = [1, 2, 3]
    masks = []
    for i, tok in enumerate(generated):
        if at and i in at:
            at[i](c)
        masks.append(c.mask_for(history))
        history.append(tok)
    masks.append(c.mask_for(history))
    return [None if m is None else tuple(np.flatnonzero(m[0])) for m in masks]


def test_forced_close_after_the_budget():
    masks = run(grammar(2), [START, 5, 6, 20, 21, END, 7])
    assert masks == [None, None, None, (20,), (21,), (END,), None, None]


def test_open_at_start_counts_from_the_first_token():
    assert run(grammar(1, open_at_start=True), [5, 20, 21, END]) == \
        [None, (20,), (21,), (END,), None]
    assert run(grammar(0, open_at_start=True), [20]) == [(20,), (21,)]


def test_a_block_closed_in_budget_is_untouched():
    assert run(grammar(5), [START, 5, END, 6, 7, 8, 9]) == [None] * 8


def test_no_message_forces_only_the_marker():
    assert run(grammar(1, forced=(END,)), [START, 5, END]) == [None, None, (END,), None]


class _Inner:
    def start(self, n_prompt):
        return self

    def mask_for(self, history):
        m = np.zeros((1, 32), dtype=bool)
        m[0, 30] = True
        return m


def test_the_inner_grammar_applies_outside_the_forced_run():
    masks = run(grammar(1, inner=_Inner()), [START, 5, 20, 21, END])
    assert masks == [(30,), (30,), (20,), (21,), (END,), (30,)]


def test_unlimited_budget_never_forces():
    assert run(grammar(-1, open_at_start=True), [5, 6, 7, 8]) == [None] * 5


def test_a_new_opener_after_a_closed_block_rearms_the_budget():
    masks = run(grammar(1), [START, 5, 20, 21, END, 6, START, 7, 20, 21, END])
    assert masks == [None, None, (20,), (21,), (END,), None, None, None,
                     (20,), (21,), (END,), None]


def test_any_end_sequence_closes_the_block():
    g = grammar(3, ends=((END,), (12, 13)))
    assert run(g, [START, 12, 13, 5, 6, 7, 8]) == [None] * 8


def force(constraint):
    constraint.force_end()


def test_force_end_while_thinking_enters_the_forced_run():
    masks = run(grammar(-1, open_at_start=True, control=True), [5, 6, 20, 21, END, 7],
                at={2: force})
    assert masks == [None, None, (20,), (21,), (END,), None, None]


def test_force_end_outside_the_block_changes_nothing():
    # before the opener, and after the close: both are no-ops, and a later
    # opener is not closed by a request that arrived before it
    masks = run(grammar(-1, control=True), [5, START, 6, END, 7], at={0: force, 4: force})
    assert masks == [None] * 6


def test_force_end_applies_after_the_tokens_drawn_since():
    # the command lands before the mask that first sees the opener: the
    # block is open by then, so it closes at once
    masks = run(grammar(-1, control=True), [START, 20, 21, END, 7], at={1: force})
    assert masks == [None, (20,), (21,), (END,), None, None]


def test_force_end_needs_armed_control():
    # a budget without reasoning_control is never closed early
    masks = run(grammar(5, open_at_start=True), [5, 6, 7], at={1: force})
    assert masks == [None] * 4


def test_two_force_ends_before_a_draw_close_once():
    masks = run(grammar(-1, open_at_start=True, control=True), [5, 20, 21, END, 7],
                at={1: lambda c: (c.force_end(), c.force_end())})
    assert masks == [None, (20,), (21,), (END,), None, None]


def test_utf8_completeness_of_a_piece():
    assert utf8_complete(b"abc") and utf8_complete("é".encode()) and utf8_complete(b"")
    assert not utf8_complete("é".encode()[:1]) and not utf8_complete("€".encode()[:2])
    assert utf8_complete("x€".encode()) and not utf8_complete(b"x" + "\U0001F600".encode()[:3])


def test_an_exhausted_budget_waits_for_a_whole_utf8_piece():
    # token 5's piece is the first byte of a two-byte character, 6 completes it
    pieces = {5: "é".encode()[:1], 6: "é".encode()[1:]}
    g = grammar(1, open_at_start=True, piece=lambda t: pieces.get(t, b"a"))
    assert run(g, [5, 6, 20, 21, END]) == [None, None, (20,), (21,), (END,), None]

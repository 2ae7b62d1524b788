"""The reasoning budget: a cap on thinking tokens, then a forced close.

`--reasoning-budget N` (or a request's reasoning_budget_tokens /
thinking_budget_tokens) lets the model think for N tokens; when the N-th
thinking token is drawn and the block is still open, the next tokens are
forced: the tokens of `--reasoning-budget-message` (if any), then those of
the closing marker, as upstream forces message + end tag.  As upstream, a
budget that runs out on a token whose piece ends inside a UTF-8 sequence
waits for the token that completes it before forcing.  A model that
closes its own block within budget is untouched; 0 closes it at once; a
new opener after a closed block starts a fresh budget, as upstream re-arms.

Realtime control (`reasoning_control: true`, then POST
/v1/chat/completions/control) enters the same forced run on demand: the
control route asks the bridge to post a `ForceEnd` command for the
request's jobs, and the engine loop, which drains its commands before every
step, calls each job's constraint's `force_end()`; the constraint acts on it
before its next draw.  As upstream's common_reasoning_budget_force, a
request that arrives while the block is not open (before it, already
forcing, or after it) changes nothing, and a grammar built without control
ignores it.

The budget rides on the job's grammar slot (`Job.grammar`, the
protocol/records.py `Grammar` whose `start(n_prompt)` gives a per-sequence
`Constraint`), wrapping whatever grammar the request already had: the inner
grammar's mask applies except while a forced token is due.  The constraint
runs on the engine thread only and sees the context as token ids; markers
are matched as token-id sequences.  Nothing here is shared across threads:
the grammar is immutable and each constraint is engine-side state.
"""

from __future__ import annotations

import numpy as np

BEFORE, THINKING, WAITING_UTF8, FORCING, DONE = range(5)
UNLIMITED = 2**31 - 1  # upstream's INT_MAX for "no budget, control only"


class BudgetGrammar:
    """Job.grammar for a budgeted request (immutable, shared read-only)."""

    def __init__(self, inner, *, n_vocab: int, budget: int, start_ids: tuple[int, ...],
                 end_seqs: tuple[tuple[int, ...], ...], forced: tuple[int, ...],
                 open_at_start: bool, control: bool = False, piece=None) -> None:
        self.inner = inner
        self.n_vocab = n_vocab
        self.budget = UNLIMITED if budget < 0 else budget
        self.start_ids = start_ids
        self.end_seqs = tuple(s for s in end_seqs if s)
        self.forced = forced              # message tokens + closing-marker tokens
        self.open_at_start = open_at_start
        self.control = control            # reasoning_control: a ForceEnd may close the block
        self.piece = piece                # token id -> bytes (None: every piece is whole)

    def start(self, n_prompt: int) -> "BudgetConstraint":
        inner = self.inner.start(n_prompt) if self.inner is not None else None
        return BudgetConstraint(self, n_prompt, inner)


def utf8_complete(piece: bytes) -> bool:
    """common_utf8_is_complete: the piece does not end inside a sequence."""
    for back in range(1, min(4, len(piece)) + 1):
        c = piece[-back]
        if c & 0xC0 != 0x80:  # a lead byte (or ASCII): does its sequence fit?
            need = 1 if c < 0x80 else 2 if c & 0xE0 == 0xC0 else 3 if c & 0xF0 == 0xE0 \
                else 4 if c & 0xF8 == 0xF0 else 1
            return back >= need
    return True


def _ends_with(seq: list[int], tail: tuple[int, ...]) -> bool:
    return bool(tail) and len(seq) >= len(tail) and tuple(seq[-len(tail):]) == tail


class BudgetConstraint:
    """One sequence's budget state (engine thread only)."""

    def __init__(self, spec: BudgetGrammar, n_prompt: int, inner) -> None:
        self.spec = spec
        self.inner = inner
        self.state = BEFORE
        self.count = 0
        self.queue: list[int] = []
        self._seen = n_prompt
        self._generated: list[int] = []
        self._force_due = False           # a ForceEnd arrived since the last mask
        if spec.open_at_start:
            self._open()

    def _open(self) -> None:
        self.state, self.count = THINKING, 0
        self._check_budget()

    def _force(self) -> None:
        self.state, self.queue = FORCING, list(self.spec.forced)
        if not self.queue:
            self.state = DONE

    def _check_budget(self) -> None:
        if self.state == THINKING and self.count >= self.spec.budget:
            self._force()

    def _accept(self, tok: int) -> None:
        self._generated.append(tok)
        if self.state in (BEFORE, DONE):
            if _ends_with(self._generated, self.spec.start_ids):
                self._open()
        elif self.state in (THINKING, WAITING_UTF8):
            if any(_ends_with(self._generated, end) for end in self.spec.end_seqs):
                self.state = DONE
                return
            whole = self.spec.piece is None or utf8_complete(self.spec.piece(tok))
            if self.state == WAITING_UTF8:
                if whole:
                    self._force()
                return
            self.count += 1
            if self.count >= self.spec.budget and not whole:
                self.state = WAITING_UTF8
                return
            self._check_budget()
        elif self.state == FORCING:
            if self.queue:
                self.queue.pop(0)
            if not self.queue:
                self.state = DONE

    def force_end(self) -> None:
        """The job's ForceEnd command (engine thread, between steps).  It takes
        effect at the next mask, once the tokens drawn since are accepted: the
        block may have opened or closed in them."""
        if self.spec.control:
            self._force_due = True

    def mask_for(self, history: list[int]) -> np.ndarray | None:
        for tok in history[self._seen:]:
            self._accept(tok)
        self._seen = len(history)
        if self._force_due:
            self._force_due = False
            if self.state == THINKING:
                self._force()
        inner = self.inner.mask_for(history) if self.inner is not None else None
        if self.state != FORCING:
            return inner
        mask = np.zeros((1, self.spec.n_vocab), dtype=bool)
        mask[0, self.queue[0]] = True
        return mask

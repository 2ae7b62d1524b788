"""The reasoning budget: a cap on thinking tokens, then a forced close.

`--reasoning-budget N` (or a request's reasoning_budget_tokens /
thinking_budget_tokens) lets the model think for N tokens; when the N-th
thinking token is drawn and the block is still open, the next tokens are
forced: the tokens of `--reasoning-budget-message` (if any), then those of
the closing marker, as upstream forces message + end tag.  A model that
closes its own block within budget is untouched; 0 closes it at once.

The budget rides on the job's grammar slot (`Job.grammar`: an object whose
`start(n_prompt)` gives a per-sequence constraint with `mask_for(history)`),
wrapping whatever grammar the request already had: the inner grammar's mask
applies except while a forced token is due.  The constraint runs on the
engine thread and sees the context as token ids; markers are matched as
token-id sequences.
"""

from __future__ import annotations

import numpy as np

BEFORE, THINKING, FORCING, DONE = range(4)


class BudgetGrammar:
    """Job.grammar for a budgeted request (immutable, shared read-only)."""

    def __init__(self, inner, *, n_vocab: int, budget: int, start_ids: tuple[int, ...],
                 end_ids: tuple[int, ...], forced: tuple[int, ...], open_at_start: bool) -> None:
        self.inner = inner
        self.n_vocab = n_vocab
        self.budget = budget
        self.start_ids = start_ids
        self.end_ids = end_ids
        self.forced = forced              # message tokens + closing-marker tokens
        self.open_at_start = open_at_start

    def start(self, n_prompt: int) -> "BudgetConstraint":
        inner = self.inner.start(n_prompt) if self.inner is not None else None
        return BudgetConstraint(self, n_prompt, inner)


def _ends_with(seq: list[int], tail: tuple[int, ...]) -> bool:
    return bool(tail) and len(seq) >= len(tail) and tuple(seq[-len(tail):]) == tail


class BudgetConstraint:
    """One sequence's budget state (engine thread only)."""

    def __init__(self, spec: BudgetGrammar, n_prompt: int, inner) -> None:
        self.spec = spec
        self.inner = inner
        self.state = THINKING if spec.open_at_start else BEFORE
        self.count = 0
        self.queue: list[int] = []
        self._seen = n_prompt
        self._generated: list[int] = []
        if self.state == THINKING:
            self._check_budget()

    def _check_budget(self) -> None:
        if self.state == THINKING and self.count >= self.spec.budget:
            self.state, self.queue = FORCING, list(self.spec.forced)
            if not self.queue:
                self.state = DONE

    def _accept(self, tok: int) -> None:
        self._generated.append(tok)
        if self.state == BEFORE:
            if _ends_with(self._generated, self.spec.start_ids):
                self.state = THINKING
                self._check_budget()
        elif self.state == THINKING:
            if _ends_with(self._generated, self.spec.end_ids):
                self.state = DONE
                return
            self.count += 1
            self._check_budget()
        elif self.state == FORCING:
            if self.queue and tok == self.queue[0]:
                self.queue.pop(0)
            if not self.queue:
                self.state = DONE

    def mask_for(self, history: list[int]) -> np.ndarray | None:
        for tok in history[self._seen:]:
            self._accept(tok)
        self._seen = len(history)
        inner = self.inner.mask_for(history) if self.inner is not None else None
        if self.state != FORCING:
            return inner
        mask = np.zeros((1, self.spec.n_vocab), dtype=bool)
        mask[0, self.queue[0]] = True
        return mask

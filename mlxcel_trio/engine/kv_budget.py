"""Unified KV: one budget of n_ctx tokens that every slot draws on.

Upstream's -kvu (its default when -np is auto) gives llama.cpp one KV
buffer of n_ctx cells shared by every sequence.  mlx-lm's batch caches
already hold each sequence at its own length, so here unified KV is
accounting only, with these rules:

- One sequence may hold up to the whole context (the slot context is n_ctx,
  capped at the training context as without it): a lone request is bounded
  as if it had the server to itself.
- A sequence holds its prompt plus what it generated so far (`held`), from
  admission (its whole prompt is reserved at once, whatever the prompt
  cache supplied) until its slot is freed.
- Admission: the oldest waiting job starts only once the tokens every live
  sequence holds plus its own prompt fit the budget; jobs behind it wait
  their turn (no overtaking, so a long prompt is never starved).  Upstream
  does not wait here: its prompt's decode finds no room and fails every
  live slot; waiting serves the same requests without that failure.
- Decode: when what the live sequences hold exceeds the budget, the next
  step would need a cell upstream's buffer does not have, and upstream
  fails every processing slot with "Context size has been exceeded." (a
  500 server error) and releases it.  The scheduler does the same, before
  the forward pass.

A budget of None is the split: each slot capped at its own share, which
bounds the total by construction and needs no accounting.
"""

from __future__ import annotations

from typing import Iterable

import attrs

# the failure code of every live job when the budget has no room for the
# next step (server/http/errors.py words it as upstream does)
CONTEXT_EXCEEDED = "context_exceeded"


@attrs.frozen
class KvBudget:
    """The shared budget, in tokens (the context, n_ctx)."""

    n_ctx: int

    def admits(self, held: int, need: int) -> bool:
        """Whether a job needing `need` tokens may start beside `held`."""
        return held + need <= self.n_ctx

    def overflows(self, held: int) -> bool:
        """Whether the next step's tokens do not fit: every live sequence's
        KV plus the token each feeds next is `held`."""
        return held > self.n_ctx


def total_held(kv_lengths: Iterable[int]) -> int:
    """What the live sequences hold together (each: prompt + generated)."""
    return sum(kv_lengths)

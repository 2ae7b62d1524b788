"""Reasoning-budget jobs: the forced close of chat/budget.py, wired onto jobs.

Two routes reach it.  The chat routes know the template's thinking markers
and pass them (chat_completions.chat_jobs).  The raw-prompt routes read
upstream's native fields (`native_jobs`), with upstream's semantics for a
request that carries no template:

* the budget applies only when the request names both a start tag and at
  least one end tag, and then only with `reasoning_budget_tokens >= 0` or
  `reasoning_control: true` (-1 with control means no budget, control only);
* the tags are tokenized with special-token parsing, and counting starts
  when the model itself emits the start tag (a raw prompt is never primed);
* `reasoning_budget_end_tags` is a list of strings (a lone string counts as
  one), `reasoning_budget_end_tag` a single string; empty tags are dropped;
* the forced run is `reasoning_budget_message` + the first end tag, and only
  when the message field is present: without it an exhausted budget forces
  nothing, exactly as upstream composes the forced sequence in the message
  field's handler.
"""

from __future__ import annotations

import attrs

from ...chat.budget import BudgetGrammar
from ...protocol.records import Job
from ..http.errors import type_error
from .schema import NativeRequest


def _ids(vocab, text: str) -> tuple[int, ...]:
    return tuple(vocab.tokenize(text, False, True)) if text else ()


def wrap(jobs: list[Job], vocab, *, budget: int, start: str, ends: list[str], message: str | None,
         open_at_start: bool, control: bool) -> list[Job]:
    """Each job's grammar wrapped in the budget: `message` None forces nothing;
    `control`: realtime reasoning control may force the close (a ForceEnd)."""
    end_seqs = tuple(_ids(vocab, e) for e in ends if e)
    forced = _ids(vocab, message) + end_seqs[0] if message is not None and end_seqs else ()
    start_ids = _ids(vocab, start)
    return [attrs.evolve(job, grammar=BudgetGrammar(
        job.grammar, n_vocab=vocab.n_vocab, budget=budget, start_ids=start_ids,
        end_seqs=end_seqs, forced=forced, open_at_start=open_at_start, control=control,
        piece=vocab.piece))
        for job in jobs]


def native_end_tags(body: dict) -> list[str]:
    """The end tags as upstream's handler reads them (which spelling, which shape)."""
    if "reasoning_budget_end_tags" in body:
        value = body["reasoning_budget_end_tags"]
        items = value if isinstance(value, list) else list(value.values()) \
            if isinstance(value, dict) else [] if value is None else [value]
        for item in items:
            if not isinstance(item, str):
                raise type_error("string", item, "reasoning_budget_end_tags")
        return [t for t in items if t]
    value = body.get("reasoning_budget_end_tag")
    if value is None:
        return []
    if not isinstance(value, str):
        raise type_error("string", value, "reasoning_budget_end_tag")
    return [value] if value else []


def native_jobs(vocab, values: NativeRequest, body: dict, jobs: list[Job],
                armed: bool = False) -> list[Job]:
    """The raw-prompt routes: the native fields' budget, when they ask for one
    (`armed`: the route registered the request for realtime control)."""
    start = values.reasoning_budget_start_tag
    if start is None and "reasoning_budget_end_tags" not in body \
            and body.get("reasoning_budget_end_tag") is None:
        return jobs
    ends = native_end_tags(body)
    budget, control = values.reasoning_budget_tokens, values.reasoning_control
    if not start or not _ids(vocab, start) or not ends or not (budget >= 0 or control):
        return jobs
    return wrap(jobs, vocab, budget=budget, start=start, ends=ends,
                message=values.reasoning_budget_message, open_at_start=False,
                control=armed and control)

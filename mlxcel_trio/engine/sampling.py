"""How a job samples: the shared greedy function, or llama.cpp's chain.

A sampler maps log-probabilities (shape [rows, V]) to token ids ([rows]).
Greedy jobs share the module-level `GREEDY` function, so the batch
generator samples an all-greedy batch in one call; every other job samples
through the scheduler's `BatchSampler` (engine/samplers/batch.py), which
runs upstream's whole chain vectorized over the rows that use it, each row
with its own seeded random stream.

A job is greedy when its draw can only ever be the best logit after the
raw-logit stages: temperature <= 0 (and no dynamic range reaching above 0),
no stage that may drop the best candidate (typical, XTC), no grammar, and
no probability report.  Logit bias and the repetition penalties still
apply to a greedy job, through its logits processor.
"""

from __future__ import annotations

import mlx.core as mx

from ..protocol.records import Constraint, SamplingParams
from .samplers.batch import BatchSampler, Row


def _greedy(logprobs: mx.array) -> mx.array:
    return mx.argmax(logprobs, axis=-1)


GREEDY = _greedy


def is_greedy(p: SamplingParams, constrained: bool = False) -> bool:
    return (p.temperature <= 0.0 and p.temperature + max(p.dynatemp_range, 0.0) <= 0.0
            and p.typical_p >= 1.0
            and not (p.xtc_probability > 0.0 and p.xtc_threshold <= 0.5)
            and p.n_probs <= 0 and not constrained)


def greedy_banning(banned: list[int], n_vocab: int):
    """Greedy with `banned` tokens never drawn: upstream's ignore_eos for a
    greedy job, as one shared sampler instead of a per-row logits processor
    (any processor in a batch makes mlx-lm process every row one by one)."""
    mask = mx.zeros((n_vocab,), dtype=mx.float32)
    if banned:
        mask[mx.array(banned)] = float("-inf")

    def sample(logprobs: mx.array) -> mx.array:
        return mx.argmax(logprobs + mask, axis=-1)
    return sample


def plan(params: SamplingParams, n_vocab: int, batch: BatchSampler, *,
         breakers=None, constraint: Constraint | None = None) -> tuple[object, list, Row]:
    """(sampler, logits processors, row state) for one sequence."""
    greedy = is_greedy(params, constraint is not None)
    row = Row(params, n_vocab, sampler=None if greedy else batch, breakers=breakers,
              constraint=constraint)
    processors = [row.process] if row.needs_processor else []
    return (GREEDY if greedy else batch), processors, row

"""Progress while the weights are read: a few log lines with bytes and
percent, so a large checkpoint does not load in silence.

mlx-lm loads safetensors lazily; the bytes are read when the parameters
are evaluated.  Evaluating them in a few groups of about equal size instead
of one `mx.eval` costs nothing measurable (the same reads, a few more graph
launches) and gives a point after each group to say how far the load got.
Small checkpoints (under MIN_BYTES) load as before, in one call and silently:
they take well under a second, and the line would only be noise.  The lines
go through the log, so they reach a terminal, --log-file and journald alike.
"""

from __future__ import annotations

import logging
import time
from typing import Any

MIN_BYTES = 256 * 2**20   # below this the load is quick: no progress lines
STEPS = 4                 # lines per load: 25 %, 50 %, 75 %, 100 %


def eval_with_progress(params: Any, log: logging.Logger, what: str = "weights",
                       min_bytes: int = MIN_BYTES, steps: int = STEPS) -> int:
    """Evaluate every array in `params` (a parameter tree), saying at each
    of `steps` points how many bytes are in; the total bytes."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    leaves = [v for _, v in tree_flatten(params) if isinstance(v, mx.array)]
    total = sum(v.nbytes for v in leaves)
    if total < min_bytes or steps < 1:
        mx.eval(leaves)
        return total
    t0 = time.perf_counter()
    done, mark, group = 0, 1, []
    for v in leaves:
        group.append(v)
        done += v.nbytes
        if done * steps >= mark * total:
            mx.eval(group)
            group = []
            log.info("loading %s: %3d%% (%.0f of %.0f MiB, %.1f s)", what, 100 * done // total,
                     done / 2**20, total / 2**20, time.perf_counter() - t0)
            mark = done * steps // total + 1
    if group:
        mx.eval(group)
    return total

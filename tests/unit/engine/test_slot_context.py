"""A slot's context: an even share of -c, capped at the training context with
upstream's warning (the server-side effects: tests/e2e/test_context.py)."""

from __future__ import annotations

import logging

from mlxcel_trio.engine.loading import n_ctx_train_of, slot_context

WARNING = "the slot context (%d) exceeds the training context of the model (%d) - capping"


def test_a_share_within_the_training_context_is_kept_silently(caplog):
    with caplog.at_level(logging.WARNING, logger="mlxcel.engine"):
        assert slot_context(4096, 4, 4096) == 1024
        assert slot_context(8192, 2, 4096) == 4096        # equal: no cap
        assert slot_context(1001, 2, 4096) == 500         # the share rounds down
    assert caplog.records == []


def test_a_larger_share_is_capped_with_upstreams_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="mlxcel.engine"):
        assert slot_context(131072, 1, 4096) == 4096
    (rec,) = caplog.records
    assert rec.levelno == logging.WARNING
    assert rec.getMessage() == WARNING % (131072, 4096)


def test_a_config_without_a_training_context_does_not_cap():
    assert n_ctx_train_of({"max_position_embeddings": 40960}, 512) == 40960
    assert n_ctx_train_of({}, 512) == 512

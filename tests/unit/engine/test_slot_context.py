"""A slot's context: an even share of -c (all of it under unified KV), capped
at the training context with upstream's warning (the server-side effects:
tests/e2e/test_context.py)."""

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


def test_unified_kv_gives_one_sequence_the_whole_context(caplog):
    with caplog.at_level(logging.WARNING, logger="mlxcel.engine"):
        assert slot_context(4096, 4, 40960, unified=True) == 4096
        assert slot_context(4096, 4, 40960, unified=False) == 1024   # -no-kvu: the split
    assert caplog.records == []
    with caplog.at_level(logging.WARNING, logger="mlxcel.engine"):
        assert slot_context(512, 2, 96, unified=True) == 96          # still capped
    assert caplog.records[0].getMessage() == WARNING % (512, 96)

"""The weights' load progress lines (engine/load_progress.py)."""

from __future__ import annotations

import logging

import mlx.core as mx

from mlxcel_trio.engine.load_progress import eval_with_progress


def _lazy_tree() -> dict:
    # eight 1 MiB float32 arrays, still lazy (nothing evaluated yet)
    return {"layers": [{"w": mx.ones((512, 512)) * i} for i in range(8)]}


def test_a_large_load_says_its_bytes_and_percent_in_steps(caplog):
    tree = _lazy_tree()
    log = logging.getLogger("test.load_progress")
    with caplog.at_level(logging.INFO, logger=log.name):
        total = eval_with_progress(tree, log, min_bytes=1, steps=4)
    assert total == 8 * 2**20
    lines = [r.getMessage() for r in caplog.records]
    assert [ln.split("%")[0].split()[-1] for ln in lines] == ["25", "50", "75", "100"], lines
    assert lines[-1].startswith("loading weights: 100% (8 of 8 MiB"), lines
    assert all(float(layer["w"][0, 0].item()) == i for i, layer in enumerate(tree["layers"]))


def test_a_small_load_is_silent(caplog):
    log = logging.getLogger("test.load_progress")
    with caplog.at_level(logging.INFO, logger=log.name):
        assert eval_with_progress(_lazy_tree(), log) == 8 * 2**20
    assert caplog.records == []

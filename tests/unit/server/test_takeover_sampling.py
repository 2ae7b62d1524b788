"""sessions/takeover.py's `unreplayed_state`: the sampler kinds whose
running state the log does not record, so a continuation refuses them
(the e2e kill test sees mirostat's error frame)."""

from __future__ import annotations

import attrs
import pytest

from mlxcel_trio.protocol.records import SamplingParams
from mlxcel_trio.server.sessions.takeover import unreplayed_state

BASE = SamplingParams()
CHAIN = BASE.samplers


@pytest.mark.parametrize("change, word", [
    ({"mirostat": 1}, "mirostat 1"),
    ({"mirostat": 2}, "mirostat 2"),
    ({"samplers": (*CHAIN, "adaptive_p"), "adaptive_target": 0.5}, "adaptive-p"),
])
def test_state_that_moves_with_each_draw_is_refused_by_name(change, word):
    why = unreplayed_state(attrs.evolve(BASE, **change))
    assert why is not None and word in why and "not recorded" in why


@pytest.mark.parametrize("change", [
    {},
    {"temperature": 0.9, "seed": 7},                          # seeded: replayed exactly
    {"samplers": (*CHAIN, "adaptive_p")},                     # in the chain, target off
])
def test_replayable_samplers_continue(change):
    assert unreplayed_state(attrs.evolve(BASE, **change)) is None

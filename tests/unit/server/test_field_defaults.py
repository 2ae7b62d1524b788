"""Each default a native request field shares with the configuration, the
command line or the engine is its table row's (protocol/fields.py)."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from mlxcel_trio.cli.options import BY_DEST
from mlxcel_trio.config import SamplingDefaults, ServerConfig
from mlxcel_trio.protocol.records import SamplingParams
from mlxcel_trio.protocol.fields import FIELDS_BY_NAME, NATIVE_FIELDS
from mlxcel_trio.server.request.jobs import server_defaults

# SamplingDefaults / ServerConfig attribute -> its field, where the names differ
_RENAMED = {"dynatemp_exp": "dynatemp_exponent"}
# (temperature / top_k / top_p default to None, "flag not given"; a row
# whose default is None is filled by the server: samplers, logit_bias, ...)
_CONFIG_ROWS = [a.name for a in attrs.fields(SamplingDefaults)
                if _RENAMED.get(a.name, a.name) in FIELDS_BY_NAME
                and FIELDS_BY_NAME[_RENAMED.get(a.name, a.name)].default is not None
                and a.name not in ("temperature", "top_k", "top_p")]


@pytest.mark.parametrize("name", _CONFIG_ROWS)
def test_sampling_defaults_are_the_rows(name: str) -> None:
    row = FIELDS_BY_NAME[_RENAMED.get(name, name)]
    assert attrs.fields_dict(SamplingDefaults)[name].default == row.default
    option = BY_DEST.get(f"sampling.{name}")
    if option is not None:
        assert option.default == row.default


@pytest.mark.parametrize("name", ["n_keep", "cache_prompt", "sse_ping_interval"])
def test_server_config_defaults_are_the_rows(name: str) -> None:
    assert attrs.fields_dict(ServerConfig)[name].default == FIELDS_BY_NAME[name].default
    assert BY_DEST[name].default == FIELDS_BY_NAME[name].default


@pytest.mark.parametrize("name, text", [("temperature", "0.80"), ("top_k", "40"),
                                        ("top_p", "0.95")])
def test_help_shows_the_rows_default_after_the_checkpoints(name: str, text: str) -> None:
    assert BY_DEST[f"sampling.{name}"].shown_default() == (
        f"from the checkpoint's generation_config.json, else {text}")


def test_help_shows_each_table_backed_default() -> None:
    assert BY_DEST["sampling.top_n_sigma"].shown_default() == "-1.00, -1.0 = disabled"
    assert BY_DEST["sampling.dry_penalty_last_n"].shown_default() == "64, 0 = disable"
    assert BY_DEST["sampling.dynatemp_exp"].shown_default() == "1.00"


@pytest.mark.parametrize("a", attrs.fields(SamplingParams), ids=lambda a: a.name)
def test_the_engines_own_defaults_agree_with_the_rows(a) -> None:
    """SamplingParams keeps defaults for engine-only callers (warm-up, tests,
    bench); where its row has a value they must agree."""
    row = FIELDS_BY_NAME[a.name]
    if row.default is not None:
        assert a.default == row.default


class _Vocab:
    eos_ids = {2}

    def __init__(self, gen: dict) -> None:
        self.generation_defaults = gen


def test_server_defaults_fall_back_to_the_rows() -> None:
    base = server_defaults(ServerConfig(model="x"), _Vocab({}))
    assert base.top_k == 40 and base.temperature == float(np.float32(0.8))
    from_checkpoint = server_defaults(ServerConfig(model="x"), _Vocab({"top_k": 20}))
    assert from_checkpoint.top_k == 20
    flagged = ServerConfig(model="x", sampling=SamplingDefaults(top_k=5))
    assert server_defaults(flagged, _Vocab({"top_k": 20})).top_k == 5


def test_every_float_row_is_float32_in_the_server_defaults() -> None:
    base = server_defaults(ServerConfig(model="x"), _Vocab({}))
    for f in NATIVE_FIELDS:
        if f.kind == "float":
            value = getattr(base, f.attr)
            assert value == float(np.float32(value)), f.name


def test_cache_reuse_is_the_request_default() -> None:
    assert attrs.fields_dict(ServerConfig)["cache_reuse"].default == \
        FIELDS_BY_NAME["n_cache_reuse"].default == BY_DEST["cache_reuse"].default
    flagged = ServerConfig(model="x", cache_reuse=256)
    assert server_defaults(flagged, _Vocab({})).n_cache_reuse == 256

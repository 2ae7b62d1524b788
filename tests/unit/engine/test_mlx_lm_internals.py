"""The startup check of mlx-lm's internals (engine/mlx_lm_internals.py)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from mlxcel_trio.engine import mlx_lm_internals
from mlxcel_trio.engine.preflight import mlx_lm_problem

ROOT = Path(__file__).resolve().parents[3]


def test_the_installed_mlx_lm_has_every_internal_the_engine_relies_on():
    assert mlx_lm_internals.missing() == []
    assert mlx_lm_problem() is None


def test_a_missing_internal_refuses_with_the_version_and_the_range(monkeypatch):
    monkeypatch.setitem(mlx_lm_internals.HAS, "mlx_lm.utils:_no_such_name", "callable")
    with pytest.raises(mlx_lm_internals.MlxLmUnsupported) as err:
        mlx_lm_internals.check()
    assert "mlx_lm.utils:_no_such_name" in str(err.value)
    assert f"install mlx-lm{mlx_lm_internals.SUPPORTED}" in str(err.value)
    assert mlx_lm_problem() == str(err.value)


def test_the_pin_is_the_supported_range_and_the_installed_version_is_in_it():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (pin,) = [d for d in project["dependencies"] if d.startswith("mlx-lm")]
    assert pin == "mlx-lm" + mlx_lm_internals.SUPPORTED
    bounds = re.fullmatch(r">=(\d+)\.(\d+),<(\d+)\.(\d+)", mlx_lm_internals.SUPPORTED)
    low_major, low_minor, high_major, high_minor = (int(x) for x in bounds.groups())
    installed = tuple(int(x) for x in mlx_lm_internals.installed_version().split(".")[:2])
    assert (low_major, low_minor) <= installed < (high_major, high_minor)

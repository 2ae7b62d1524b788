"""Every route of protocol/routes.py has a fast-tier test.

A test says which routes it requests with `@pytest.mark.route("METHOD
/path")` (on the test or on a parametrized case); conftest checks after each
test that it really requested them.  Here, every (method, path) of ROUTES
must be named by some test of this directory, and no mark may name a route
the table does not have: a new route needs a fast-tier test.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

from mlxcel_trio.protocol.routes import ROUTES

HERE = Path(__file__).parent


def _marks(obj) -> list:
    return [m for m in getattr(obj, "pytestmark", []) if m.name in ("route", "parametrize")]


def _route_specs(fn) -> set[str]:
    specs: set[str] = set()
    for mark in _marks(fn):
        if mark.name == "route":
            specs.update(mark.args)
            continue
        for case in mark.args[1]:   # parametrize(argnames, argvalues)
            for sub in getattr(case, "marks", ()):
                if sub.name == "route":
                    specs.update(sub.args)
    return specs


def covered() -> dict[str, list[str]]:
    """Route spec -> the tests that mark it, over every module of the tier."""
    out: dict[str, list[str]] = {}
    for path in sorted(HERE.glob("test_*.py")):
        module = importlib.import_module(f"{__package__}.{path.stem}")
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if name.startswith("test_"):
                for spec in _route_specs(fn):
                    out.setdefault(spec, []).append(f"{path.name}::{name}")
    return out


def test_every_route_has_a_fast_test():
    table = {f"{r.method} {r.path}" for r in ROUTES}
    marked = covered()
    missing = sorted(table - set(marked))
    assert not missing, ("routes with no fast-tier test (mark one with "
                         f"@pytest.mark.route('METHOD /path')): {missing}")
    stale = sorted(set(marked) - table)
    assert not stale, f"route marks naming no route of protocol/routes.py: {stale}"

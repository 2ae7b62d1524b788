"""The speculative defaults have one home, protocol/speculative.py's
SpecSettings: the configuration, a request's own bounds and the command
line's options all agree with it."""

from __future__ import annotations

import attrs
import pytest

from mlxcel_trio.cli.options import BY_DEST
from mlxcel_trio.config import ServerConfig
from mlxcel_trio.protocol.speculative import SpecRequest, SpecSettings

SPEC_FIELDS = [a.name for a in attrs.fields(ServerConfig)
               if a.name.startswith("spec_") and isinstance(a.default, (int, float))
               and not isinstance(a.default, bool)]


def test_the_configuration_builds_the_default_settings():
    assert ServerConfig(model="x").speculative == SpecSettings()


def test_a_requests_bounds_default_to_the_servers():
    s = SpecSettings()
    assert SpecRequest() == SpecRequest(s.n_max, s.n_min, s.p_min)


@pytest.mark.parametrize("dest", SPEC_FIELDS)
def test_each_options_default_is_the_configurations(dest):
    assert dest in BY_DEST, dest
    assert BY_DEST[dest].default == attrs.fields_dict(ServerConfig)[dest].default

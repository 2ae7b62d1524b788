"""server/runner.py model_name: the name every response serves the model as."""

from __future__ import annotations

from mlxcel_trio.cli.main import build_config
from mlxcel_trio.cli.parser import parse


def _name(argv: list[str], resolved: str = "/abs/models/tiny") -> str:
    from mlxcel_trio.server.runner import model_name
    return model_name(build_config(parse(argv, env={}), resolved))


def test_the_model_value_as_written_is_the_name():
    # upstream serves params.model.path: the -m value as typed, not its
    # resolved path or its directory name
    assert _name(["-m", "models/tiny"]) == "models/tiny"
    assert _name(["-m", "./tiny/"]) == "./tiny/"
    assert _name(["-m", "/abs/models/tiny"]) == "/abs/models/tiny"


def test_an_alias_wins_and_a_repo_is_named_as_written():
    assert _name(["-m", "models/tiny", "-a", "zebra,apple"]) == "apple"
    assert _name(["-hf", "org/repo:Q4_K_M"]) == "org/repo:Q4_K_M"

"""The console scripts: `mlxcel-server`, `mlxcel` and `python -m mlxcel_trio`.

The command line (cli/) parses, checks and resolves; the config it hands
back is served by the server's runner, imported only then (it is heavy).
This is the one module that joins the two, so cli/ imports nothing of
server/ (tests/unit/test_layering.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .cli.main import SERVER_PROG, mlxcel_command, startup
from .config import ServerConfig


def _serve(outcome: ServerConfig | int) -> int:
    if isinstance(outcome, int):  # an action, or a refusal already printed
        return outcome
    from .server.runner import run  # heavy: imported only now

    return run(outcome)


def server_main(
    argv: Sequence[str] | None = None,
    *,
    prog: str = SERVER_PROG,
    env: Mapping[str, str] | None = None,
) -> int:
    """`mlxcel-server`: parse, validate, resolve, then run the server."""
    return _serve(startup(argv, prog=prog, env=env))


def mlxcel_main(argv: Sequence[str] | None = None) -> int:
    """`mlxcel <command>`; `mlxcel serve ...` is exactly `mlxcel-server ...`."""
    return _serve(mlxcel_command(argv))

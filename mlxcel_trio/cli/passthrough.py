"""The command line a router hands to each model's own server.

A router (server/router/) serves every model through one `mlxcel-server -m
MODEL` child.  The child gets the router's own command line minus what only
the router means (where to listen, which models, how many at once, TLS and
the log file) and minus the model source, which it gets per model.  The
environment carries the rest (LLAMA_ARG_* for everything not on the command
line), less the same router-only variables.
"""

from __future__ import annotations

from typing import Sequence

from mlxcel_trio.cli.options import OPTIONS
from mlxcel_trio.cli.parser import build_parser, underscores_as_dashes

# what the router keeps to itself (the rows marked router_only): its listening
# address and TLS, the model source and the model set, the log file (each
# child's output is relayed)
ROUTER_ONLY = frozenset(opt.dest for opt in OPTIONS if opt.router_only)


def child_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """`argv` without the router-only options (each with its values)."""
    parser = build_parser()
    actions = parser._option_string_actions  # spelling -> argparse action
    argv = underscores_as_dashes(argv, parser)
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        spelling, eq, _ = token.partition("=")
        action = actions.get(spelling) if token.startswith("-") else None
        if action is None:
            out.append(token)
            i += 1
            continue
        taken = 0 if eq or action.nargs == 0 else (action.nargs or 1)
        if action.dest not in ROUTER_ONLY:
            out.extend(argv[i:i + 1 + taken])
        i += 1 + taken
    return tuple(out)


def router_only_env() -> frozenset[str]:
    """The variables the router keeps from each model's server: the
    router-only options' LLAMA_ARG_* names and their LLAMA_ARG_NO_* forms."""
    names = {opt.env for opt in OPTIONS if opt.dest in ROUTER_ONLY and opt.env}
    return frozenset(names | {f"LLAMA_ARG_NO_{name.removeprefix('LLAMA_ARG_')}"
                              for name in names})

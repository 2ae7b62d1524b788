"""Run llama.cpp's server pytest suite against a binary on a local checkpoint.

    python scripts/conformance/upstream_suite.py SUITE --server BIN --model PATH
        [--python PY] [--junit FILE] [--timeout S] [--port N]
        [--skip MODULE ...] [--no-default-skips] [--slow] [-- PYTEST_ARGS...]

SUITE is the suite's directory (``tools/server/tests`` of a llama.cpp
checkout; its ``unit/`` holds the test modules), BIN the server binary
under test (``llama-server`` or an ``mlxcel-server``), PATH the checkpoint
that binary loads: a GGUF file for llama-server, an MLX directory for
mlxcel-server.  Every server the suite starts is pointed at PATH by the
``local_checkpoint`` plugin next to this script; nothing is downloaded.

PY is the interpreter that runs pytest (default: this one); it needs the
suite's own requirements (pytest, requests, wget, openai,
prometheus-client).  The modules in DEFAULT_SKIPS are left out unless
--no-default-skips is given; the tests marked slow (real models from the
hub, meaningless on a tiny local checkpoint) only with --slow, as the
suite's own runner does.  The run writes per-test outcomes as JUnit
XML to FILE when --junit is given.  The exit status is pytest's.

Dev-only: nothing here ships with the package, and the suite itself is
not part of this repository.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Modules a run against one local checkpoint cannot measure: every server the
# suite starts loads that one causal chat model (local_checkpoint.py) and
# nothing can be downloaded.  Each line says what the module needs instead;
# the features themselves are covered by this repository's own tests.
DEFAULT_SKIPS = (
    "test_embedding",  # an embedding model (bge-small); the checkpoint is a chat model
    "test_rerank",  # a reranker model (jina-reranker)
    "test_lora",  # an adapter downloaded from the hub, trained for upstream's model
    "test_speculative",  # a draft model downloaded from the hub
    "test_vision_api",  # a vision model and its projector (tinygemma3)
    "test_router",  # several models in the hub cache and hub downloads
    "test_proxy",  # --ui-mcp-proxy, refused here (not_applicable: no server-side tools)
    "test_mcp_servers",  # MCP servers, refused here (not_applicable)
    "test_tools_builtin",  # --tools, refused here (not_applicable)
)


def free_port(preferred: int = 8080) -> int:
    """The suite's default port when it is free (the Vertex tests need it:
    AIP_MODE servers listen on AIP_HTTP_PORT, 8080 by default), else any."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", preferred))
        except OSError:
            sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build_command(args: argparse.Namespace) -> list[str]:
    command = [args.python, "-m", "pytest", "-p", "local_checkpoint", "-p", "no:cacheprovider", "-rA"]
    if not args.slow:
        command += ["-m", "not slow"]
    skips = [] if args.no_default_skips else list(DEFAULT_SKIPS)
    skips.extend(args.skip)
    for module in skips:
        command.append(f"--ignore=unit/{module.removesuffix('.py')}.py")
    if args.junit:
        command.append(f"--junitxml={Path(args.junit).resolve()}")
    command.extend(args.pytest_args or ["unit"])
    return command


def build_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    env["LLAMA_SERVER_BIN_PATH"] = str(Path(args.server).resolve())
    env["CONFORMANCE_MODEL"] = str(Path(args.model).resolve())
    env["CONFORMANCE_TEST_TIMEOUT"] = str(args.timeout)
    env["PORT"] = str(args.port or free_port())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH", "")]))
    return env


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suite", help="the suite's directory (tools/server/tests)")
    parser.add_argument("--server", required=True, help="server binary under test")
    parser.add_argument("--model", required=True, help="local checkpoint for that binary")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs pytest")
    parser.add_argument("--junit", help="write per-test outcomes as JUnit XML here")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per test phase")
    parser.add_argument("--port", type=int, help="server port (default: 8080 if free, else a free one)")
    parser.add_argument("--skip", action="append", default=[], help="another module to leave out")
    parser.add_argument("--no-default-skips", action="store_true", help="run the DEFAULT_SKIPS modules too")
    parser.add_argument("--slow", action="store_true", help="run the tests marked slow too")
    own, pytest_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = parser.parse_args(own)
    args.pytest_args = pytest_args
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    suite = Path(args.suite).resolve()
    if not (suite / "unit").is_dir() or not (suite / "utils.py").is_file():
        print(f"{suite}: not the server test suite (no unit/ or utils.py)", file=sys.stderr)
        return 2
    # the suite names chat templates as ../../../models/templates/*.jinja from its
    # directory: without them every server given one dies at startup
    templates = suite.parents[2] / "models" / "templates"
    if not templates.is_dir():
        print(f"{templates}: missing; the suite's --chat-template-file arguments point there "
              "(extract the checkout's models/templates/ next to tools/)", file=sys.stderr)
        return 2
    command = build_command(args)
    print(" ".join(command), file=sys.stderr)
    return subprocess.call(command, cwd=suite, env=build_env(args))


if __name__ == "__main__":
    sys.exit(main())

"""Entry points: `mlxcel-server` and `mlxcel serve` (the same server path).

Startup is parse -> check (every option we do not act on is classified
here: inert values pass, tuning values are noted for the startup line, the
rest is refused; every problem of the command line and the environment is
reported in the same run) -> resolve the model reference -> build the frozen
`ServerConfig` -> hand it to the server runner.  Until the runner is
imported, only the standard library, attrs and this package's light modules
are loaded (huggingface_hub too, but only to fetch a repo id), so every
refusal prints its one line and exits well within a third of a second.

Exit codes: 0 after --help, --version, --completion-bash, --cache-list,
--list-devices or --dump-flag-surface; 1 for any
startup error (one ``error: ...`` line per problem on stderr, never a
traceback);
otherwise whatever the runner returns.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from mlxcel_trio import blas
from mlxcel_trio.cli import actions, model_ref, sinks
from mlxcel_trio.cli.draft_check import vocab_problem
from mlxcel_trio.cli.options import BY_DEST, OPTIONS, Option
from mlxcel_trio.cli.options_chat import check_legacy_template
from mlxcel_trio.cli.options_context import rope_reciprocal_refusal
from mlxcel_trio.cli.parser import (
    CliError,
    Parsed,
    build_parser,
    describe,
    parse_all,
    validate,
    without_effect,
)
from mlxcel_trio.cli.surface import dump_flag_surface
from mlxcel_trio.config import RopeOverrides, SamplingDefaults, ServerConfig
from mlxcel_trio.protocol.kv_types import DEFAULT as DEFAULT_KV
from mlxcel_trio.protocol.kv_types import pair_problem

SERVER_PROG = "mlxcel-server"
# The inert classifications: such an option may have no ServerConfig field.
_INERT = frozenset({"deferred", "not_applicable"})
# Options the cli consumes itself while resolving the model.
_CLI_ONLY = frozenset({"hf_token", "hf_repo"})


def version_text() -> str:
    """The version banner, shaped like upstream's two lines."""
    import platform
    from importlib import metadata

    try:
        version = metadata.version("mlxcel-trio")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return (
        f"version: {version} (mlxcel-trio)\n"
        f"built with Python {platform.python_version()} for "
        f"{platform.system()} {platform.machine()}"
    )


def build_config(
    parsed: Parsed, model_path: str, table: Sequence[Option] = OPTIONS
) -> ServerConfig:
    """Map each option's dest onto ServerConfig ("sampling.x" onto
    SamplingDefaults); `model` becomes the resolved directory and the value
    as given is kept in `model_ref`."""
    top: dict[str, Any] = {}
    sampling: dict[str, Any] = {}
    rope: dict[str, Any] = {}
    fields = {
        "": (top, attrs.fields_dict(ServerConfig)),
        "sampling": (sampling, attrs.fields_dict(SamplingDefaults)),
        "rope": (rope, attrs.fields_dict(RopeOverrides)),
    }
    by_dest = {opt.dest: opt for opt in table}
    for dest, value in parsed.values.items():
        group, _, key = dest.rpartition(".")
        target, known = fields[group]
        if key in known:
            target[key] = value
        elif by_dest[dest].status not in _INERT and dest not in _CLI_ONLY:
            raise AssertionError(f"{by_dest[dest].name} has no ServerConfig field {dest!r}")
    top.update(model=model_path,
               model_ref=parsed.values.get("hf_repo") or parsed.values.get("model"))
    return ServerConfig(**top, sampling=SamplingDefaults(**sampling), rope=RopeOverrides(**rope))


def check_rope(parsed: Parsed) -> None:
    """--rope-scale and --rope-freq-scale given together must agree."""
    values = parsed.values
    reason = rope_reciprocal_refusal(values.get("rope.scale"), values.get("rope.freq_scale"))
    if reason is not None:
        raise CliError(f"{describe(BY_DEST['rope.freq_scale'], parsed)}: {reason}")


def check_chat_template(parsed: Parsed) -> None:
    """With --no-jinja the template must select a built-in format."""
    reason = check_legacy_template(parsed.values)
    if reason is not None:
        dest = "chat_template" if parsed.values.get("chat_template") else "chat_template_file"
        raise CliError(f"{describe(BY_DEST[dest], parsed)}: {reason}")


def check_blas(parsed: Parsed) -> None:
    """--blas names auto, bundled or a library that exists."""
    reason = blas.setting_problem(parsed.values.get("blas", blas.AUTO))
    if reason is not None:
        raise CliError(f"{describe(BY_DEST['blas'], parsed)}: {reason}")


def check_kv_types(parsed: Parsed) -> None:
    """-ctk and -ctv must be a pair MLX's attention can read."""
    values = parsed.values
    reason = pair_problem(values.get("cache_type_k", DEFAULT_KV),
                          values.get("cache_type_v", DEFAULT_KV))
    if reason is not None:
        given = [BY_DEST[d] for d in ("cache_type_k", "cache_type_v") if d in parsed.given]
        raise CliError(f"{', '.join(describe(opt, parsed) for opt in given)}: {reason}")


def check_speculative(parsed: Parsed) -> None:
    """draft-simple needs a draft model, and a draft model needs
    draft-simple (given alone, -md selects it)."""
    values = parsed.values
    types = values.get("spec_type", ("none",))
    model = values.get("spec_model")
    if "draft-simple" in types and not model:
        raise CliError(f"{describe(BY_DEST['spec_type'], parsed)}: draft-simple needs a draft "
                       "model; add -md <draft checkpoint>")
    if model and "spec_type" in parsed.given and "draft-simple" not in types:
        raise CliError(f"{describe(BY_DEST['spec_model'], parsed)}: only --spec-type "
                       "draft-simple uses a draft model; add draft-simple to --spec-type "
                       "or drop -md")


def _draft(parsed: Parsed, target: str) -> dict[str, Any]:
    """-md resolved like -m, and checked against the target's vocabulary."""
    ref = parsed.values.get("spec_model")
    if not ref:
        return {}
    option = describe(BY_DEST["spec_model"], parsed)
    try:
        path = model_ref.resolve(ref, token=parsed.values.get("hf_token") or None).path
    except model_ref.ModelRefError as exc:
        raise CliError(f"{option}: {exc}") from None
    problem = vocab_problem(target, path)
    if problem is not None:
        raise CliError(f"{option}: {problem}; use a draft checkpoint built with the "
                       "target's tokenizer")
    out: dict[str, Any] = {"spec_model": path}
    if "spec_type" not in parsed.given:
        out["spec_type"] = ("draft-simple",)
    return out


def _checked(parsed: Parsed, env: Mapping[str, str]) -> dict[str, Any]:
    """Every check that needs no model: refusals, option pairs, the files
    the server will use (log, keys, TLS) and the AIP_* environment.  All
    problems are reported together, so one run shows everything to fix."""
    problems: list[CliError] = [CliError(*parsed.problems)]
    io: dict[str, Any] = {}
    for check in (validate, check_rope, check_chat_template, check_kv_types, check_blas,
                  check_speculative,
                  lambda p: io.update(sinks.resolve(p, env)),
                  lambda p: io.update(_vertex(p, env))):
        try:
            check(parsed)
        except CliError as exc:
            problems.append(exc)
    error = CliError.gather(problems)
    if error is not None:
        raise error
    return io


def configure(parsed: Parsed, env: Mapping[str, str] | None = None) -> ServerConfig:
    """Validate, check the files the server will use, resolve the model, and
    build the config (no server starts)."""
    io = _checked(parsed, os.environ if env is None else env)
    ref = parsed.values.get("model")
    repo = parsed.values.get("hf_repo")
    if repo:
        # upstream: --hf-repo wins over -m; say what was superseded
        if ref and ref != repo:
            print(f"warning: --hf-repo {repo} supersedes --model {ref}", file=sys.stderr)
        ref = repo
    if parsed.values.get("offline"):
        os.environ["HF_HUB_OFFLINE"] = "1"  # process-wide, as upstream's --offline
    if not ref:
        raise CliError(
            "no model given: pass -m/--model (or set LLAMA_ARG_MODEL) with "
            f"{model_ref.INSTEAD.removeprefix('use ')}"
        )
    try:
        resolved = model_ref.resolve(ref, token=parsed.values.get("hf_token") or None)
    except model_ref.ModelRefError as exc:
        origin = parsed.given.get("model", "argv")
        via = "" if origin == "argv" else f" (from {origin})"
        raise CliError(f"{model_ref.OPTION} {ref!r}{via}: {exc}") from None
    sides = {}
    for dest, option in (("embedding_model", "--embedding-model"),
                         ("reranker_model", "--reranker-model")):
        side = parsed.values.get(dest)
        if side:  # resolved as -m is: a local checkpoint or a Hub repo id
            try:
                sides[dest] = model_ref.resolve(
                    side, token=parsed.values.get("hf_token") or None).path
            except model_ref.ModelRefError as exc:
                raise CliError(f"{option} {side!r}: {exc}") from None
    sides.update(_draft(parsed, resolved.path))
    return attrs.evolve(build_config(parsed, resolved.path), no_effect=without_effect(parsed),
                        **io, **sides)


def _vertex(parsed: Parsed, env: Mapping[str, str]) -> dict[str, Any]:
    """The AIP_* settings (Vertex AI), checked before any model is resolved."""
    from mlxcel_trio.server.surfaces.vertex_env import GcpConfigError, GcpParams

    try:
        gcp = GcpParams.from_env(env)
    except GcpConfigError as exc:
        raise CliError(str(exc)) from None
    if not gcp.enabled:
        return {}
    port = parsed.values.get("port", 8080)
    return {"aip_health_route": gcp.health_path or None, "aip_predict_route": gcp.predict_path,
            "port": gcp.port, "aip_replaced_port": port if port != gcp.port else None}


def prepare(
    argv: Sequence[str], env: Mapping[str, str] | None = None, prog: str = SERVER_PROG
) -> ServerConfig:
    """Everything `server_main` does before the runner, in-process: the
    config a command line would serve with, or CliError with its one line."""
    parsed = parse_all(argv, env=env, prog=prog)
    if parsed.action is not None:
        raise CliError(f"{parsed.action} is an action; it starts no server")
    return configure(parsed, env)


def server_main(
    argv: Sequence[str] | None = None,
    *,
    prog: str = SERVER_PROG,
    env: Mapping[str, str] | None = None,
) -> int:
    """`mlxcel-server`: parse, validate, resolve, then run the server."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parsed = parse_all(argv, env=env, prog=prog)
        if parsed.action == "help":
            sys.stdout.write(build_parser(prog=prog).format_help())
            return 0
        if parsed.action == "version":
            print(version_text(), file=sys.stderr)  # upstream prints it on stderr
            return 0
        if parsed.action == "dump_flag_surface":
            sys.stdout.write(dump_flag_surface() + "\n")
            return 0
        if parsed.action == "completion_bash":
            sys.stdout.write(actions.completion_bash(prog))
            return 0
        if parsed.action == "list_devices":
            sys.stdout.write(actions.list_devices())
            return 0
        if parsed.action == "cache_list":
            sys.stdout.write(actions.cache_list(os.environ if env is None else env))
            return 0
        config = configure(parsed, env)
    except CliError as exc:
        for line in exc.lines:
            print(f"error: {line}", file=sys.stderr)
        return 1
    if env is None:  # a real process: MLX is not loaded yet, so a BLAS can still be preloaded
        blas.reexec_if_useful(config.blas)
    from mlxcel_trio.server.runner import run  # heavy: imported only now

    return run(config)


# The `mlxcel` subcommands: name -> one-line description.
COMMANDS: dict[str, str] = {
    "serve": "run the llama-server compatible HTTP server (same as mlxcel-server)",
}


def _mlxcel_help() -> str:
    width = max(len(name) for name in COMMANDS) + 4
    rows = "".join(f"  {name:<{width}}{text}\n" for name, text in COMMANDS.items())
    return (
        "usage: mlxcel <command> [options]\n\n"
        "MLX inference tools with a llama.cpp compatible surface.\n\n"
        f"commands:\n{rows}\n"
        "Run 'mlxcel <command> --help' for the options of a command.\n"
    )


def mlxcel_main(argv: Sequence[str] | None = None) -> int:
    """`mlxcel <command>`; `mlxcel serve ...` is exactly `mlxcel-server ...`."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        sys.stderr.write(_mlxcel_help())
        return 1
    if argv[0] in ("-h", "--help", "--usage"):
        sys.stdout.write(_mlxcel_help())
        return 0
    if argv[0] == "--version":
        print(version_text(), file=sys.stderr)
        return 0
    if argv[0] == "serve":
        return server_main(argv[1:], prog="mlxcel serve")
    print(f"error: unknown command {argv[0]!r} (commands: {', '.join(COMMANDS)})",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(server_main())

"""The command lines of `mlxcel-server` and `mlxcel` (`mlxcel serve` is the
same server path); the console scripts are mlxcel_trio/entry.py's.

Startup is parse -> check (every option we do not act on is classified
here: inert values pass, tuning values are noted for the startup line, the
rest is refused; every problem of the command line and the environment is
reported in the same run) -> resolve the model reference -> build the frozen
`ServerConfig`, which entry.py hands to the server runner.  Until the
runner is imported, only the standard library, attrs and this package's light modules
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
from pathlib import Path
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from mlxcel_trio import blas
from mlxcel_trio.cli import actions, model_ref, override_kv, sinks
from mlxcel_trio.cli.options import BY_DEST, OPTIONS, Option
from mlxcel_trio.cli.checks import (
    adapters_in_order,
    check_blas,
    check_chat_template,
    check_kv_types,
    check_rope,
    check_session_store,
    check_speculative,
    resolve_draft,
    ui_settings,
)
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
from mlxcel_trio.cli.vertex_env import GcpConfigError, GcpParams
from mlxcel_trio.config import RopeOverrides, SamplingDefaults, ServerConfig

SERVER_PROG = "mlxcel-server"
# The inert classifications: such an option may have no ServerConfig field.
_INERT = frozenset({"deferred", "not_applicable"})
# Options the cli consumes itself while resolving the model.
_CLI_ONLY = frozenset({"hf_repo"})


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
    values = dict(parsed.values)
    for dest, value in override_kv.resolved(values.get("override_kv")).items():
        # a --rope-* option given beats the metadata override, as upstream's do
        if not dest.startswith("rope.") or values.get(dest) == by_dest[dest].default:
            values[dest] = value
    for dest, value in values.items():
        group, _, key = dest.rpartition(".")
        target, known = fields[group]
        if key in known:
            target[key] = value
        elif by_dest[dest].status not in _INERT and dest not in _CLI_ONLY:
            raise AssertionError(f"{by_dest[dest].name} has no ServerConfig field {dest!r}")
    top.update(model=model_path,
               model_ref=parsed.values.get("hf_repo") or parsed.values.get("model"),
               adapters=adapters_in_order(parsed))
    return ServerConfig(**top, sampling=SamplingDefaults(**sampling), rope=RopeOverrides(**rope))


def _checked(parsed: Parsed, env: Mapping[str, str]) -> dict[str, Any]:
    """Every check that needs no model: refusals, option pairs, the files
    the server will use (log, keys, TLS) and the AIP_* environment.  All
    problems are reported together, so one run shows everything to fix."""
    problems: list[CliError] = [CliError(*parsed.problems)]
    io: dict[str, Any] = {}
    for check in (validate, check_rope, check_chat_template, check_kv_types, check_blas,
                  check_speculative, check_session_store,
                  lambda p: io.update(sinks.resolve(p, env)),
                  lambda p: io.update(ui_settings(p)),
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
    if parsed.values.get("model_store_root"):  # process-wide: a router's children inherit it
        os.environ["MLXCEL_MODELS_DIR"] = str(Path(parsed.values["model_store_root"]).expanduser())
    models_dir = parsed.values.get("models_dir")
    preset_file = parsed.values.get("models_preset")
    for dest, given in (("models_dir", models_dir), ("models_preset", preset_file)):
        if ref and given:
            raise CliError(f"{describe(BY_DEST[dest], parsed)}: {BY_DEST[dest].name} configures "
                           "router mode, which has no -m/--model; drop one of them")
    if not ref:  # upstream: no model is router mode, over the model cache at least
        from mlxcel_trio.cli import presets
        from mlxcel_trio.cli.passthrough import child_argv, router_only_env

        glob, sections = None, ()
        if preset_file:
            try:
                glob, sections = presets.load(preset_file)
            except presets.PresetError as exc:
                raise CliError(f"{describe(BY_DEST['models_preset'], parsed)}: {exc}") from None
        return attrs.evolve(build_config(parsed, ""), router=True, no_effect=without_effect(parsed),
                            child_args=child_argv(parsed.argv), child_env_drop=router_only_env(),
                            preset_global=glob, presets=sections, **io)
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
    sides.update(resolve_draft(parsed, resolved.path))
    return attrs.evolve(build_config(parsed, resolved.path), no_effect=without_effect(parsed),
                        cache_ram_auto="cache_ram" not in parsed.given, **io, **sides)


def _vertex(parsed: Parsed, env: Mapping[str, str]) -> dict[str, Any]:
    """The AIP_* settings (Vertex AI), checked before any model is resolved."""
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


def startup(
    argv: Sequence[str] | None = None,
    *,
    prog: str = SERVER_PROG,
    env: Mapping[str, str] | None = None,
) -> ServerConfig | int:
    """`mlxcel-server` up to the runner: parse, validate, resolve.  Returns
    the config to serve, or the exit code of an action or a refusal (its
    lines already printed).  The console scripts (mlxcel_trio/entry.py)
    hand the config to the server's runner."""
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
    if env is None and not config.router:  # MLX not loaded yet: a BLAS can still be preloaded
        blas.reexec_if_useful(config.blas)
    return config


# The `mlxcel` subcommands: name -> one-line description.
COMMANDS: dict[str, str] = {
    "serve": "run the llama-server compatible HTTP server (same as mlxcel-server)",
    "download": "fetch an MLX checkpoint (owner/name) into the Hugging Face cache",
    "list": "list the MLX checkpoints in the Hugging Face cache",
    "rm": "remove a checkpoint (owner/name) from the Hugging Face cache",
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


def mlxcel_command(argv: Sequence[str] | None = None) -> ServerConfig | int:
    """`mlxcel <command>`: the exit code, or for `mlxcel serve ...` what
    `startup` gives `mlxcel-server ...` (the same path)."""
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
        return startup(argv[1:], prog="mlxcel serve")
    if argv[0] in ("download", "list", "rm"):
        from mlxcel_trio.cli import store

        return store.main(argv[0], argv[1:])
    print(f"error: unknown command {argv[0]!r} (commands: {', '.join(COMMANDS)})",
          file=sys.stderr)
    return 1

"""The entry points as processes: refusals are fast one-liners, --help and
--dump-flag-surface come from the table, and `mlxcel serve` is mlxcel-server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from mlxcel_trio import entry
from mlxcel_trio.cli import main
from mlxcel_trio.cli.options import OPTIONS
from mlxcel_trio.cli.parser import help_text
from mlxcel_trio.cli.record import OWNERS
from mlxcel_trio.cli.surface import option_record
from mlxcel_trio.config import ServerConfig

from ._proc import clean_env, run_cli

HEAVY = ("mlx", "mlx_lm", "transformers", "quart", "quart_trio", "hypercorn", "trio")

REFUSALS = [
    (["-m", "model-q4_k_m.gguf"], "--model 'model-q4_k_m.gguf'"),
    (["-m", "m-00001-of-00003.gguf"], "split GGUF shard"),
    (["-m", "https://example.com/model"], "URLs are not accepted"),
    (["--model", "hf://owner/name"], "use --model owner/name"),
    (["--port", "abc"], "invalid value 'abc' for --port"),
    (["-np", "0", "-m", "x"], "--parallel '0': invalid value for n_parallel"),
    (["--ctx", "10"], "invalid argument: --ctx"),
]


@pytest.mark.parametrize(("args", "needle"), REFUSALS, ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_refusal_is_one_fast_line(args: list[str], needle: str) -> None:
    run = run_cli(args)
    assert run.rc == 1
    assert run.stdout == ""
    assert len(run.stderr_lines) == 1, run.stderr
    assert run.stderr_lines[0].startswith("error: ") and needle in run.stderr
    assert run.seconds < 1.0


@pytest.mark.parametrize("script", [["mlxcel-server"], ["mlxcel", "serve"]], ids=" ".join)
def test_console_scripts_exit_with_the_returned_code(script: list[str]) -> None:
    run = run_cli([*script[1:], "-m", "x.gguf"], script=script[0])
    assert run.rc == 1 and len(run.stderr_lines) == 1 and "GGUF" in run.stderr
    assert run.seconds < 1.0


def test_no_model_is_router_mode_over_the_model_cache() -> None:
    # upstream: neither -m nor --models-dir starts the router over the cache
    config = main.prepare([], env={})
    assert config.router and config.models_dir is None and config.model == ""


def test_router_mode_hands_its_children_their_command_line_and_environment() -> None:
    """The router keeps where it listens and which models it serves; each
    model's server gets the rest, on its command line and in its
    environment (server/router/runner.py filters os.environ by the names)."""
    config = main.prepare(["--port", "9000", "-c", "256", "--models-max", "2"], env={})
    assert config.router and config.child_args == ("-c", "256")
    assert {"LLAMA_ARG_PORT", "LLAMA_ARG_NO_PORT", "LLAMA_ARG_MODELS_MAX",
            "LLAMA_ARG_MODEL"} <= config.child_env_drop
    assert "LLAMA_ARG_CTX_SIZE" not in config.child_env_drop


def test_env_refusal_names_the_variable() -> None:
    run = run_cli([], LLAMA_ARG_MODEL="/srv/m.gguf")
    assert run.rc == 1 and "(from LLAMA_ARG_MODEL)" in run.stderr


_PROBE = """
import sys, types
seen = {}
def run(config):
    seen["heavy"] = sorted(m for m in %(heavy)r if m in sys.modules)
    seen["config"] = config
    return 7
fake = types.ModuleType("mlxcel_trio.server.runner")
fake.run = run
sys.modules["mlxcel_trio.server.runner"] = fake
from mlxcel_trio.entry import server_main
rc = server_main(sys.argv[1:])
print(rc, seen.get("heavy"), sorted(m for m in %(heavy)r if m in sys.modules))
"""


@pytest.mark.parametrize(("args", "reaches_runner"), [
    (["-m", "x.gguf"], False), (["-np", "0"], False), (["-m", "CKPT", "-np", "2"], True),
    (["-t", "8", "-m", "CKPT"], True), (["-ctk", "q4_0", "-m", "CKPT"], False),
    (["--fim-qwen-7b-default"], False), (["-m", "CKPT", "-t", "0", "--no-ui", "-fa", "on"], True)])
def test_nothing_heavy_is_imported_before_the_runner(
    args: list[str], reaches_runner: bool, checkpoint: Path
) -> None:
    args = [str(checkpoint) if a == "CKPT" else a for a in args]
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE % {"heavy": HEAVY}, *args],
        capture_output=True, text=True, env=clean_env(), timeout=60,
    )
    rc, at_run, at_exit = proc.stdout.strip().split(" ", 2)
    assert at_exit == "[]"
    if reaches_runner:
        assert (rc, at_run) == ("7", "[]")
    else:
        assert (rc, at_run) == ("1", "None")


def test_server_main_hands_the_config_to_the_runner(
    monkeypatch: pytest.MonkeyPatch, checkpoint: Path
) -> None:
    got: list[ServerConfig] = []
    fake = types.ModuleType("mlxcel_trio.server.runner")
    fake.run = lambda config: got.append(config) or 3  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mlxcel_trio.server.runner", fake)
    env = {"LLAMA_ARG_PORT": "9001", "LLAMA_API_KEY": "k"}
    rc = entry.server_main(["-m", str(checkpoint), "--temp", "0", "-a", "b,a"], env=env)
    assert rc == 3
    (config,) = got
    assert config.model == str(checkpoint.resolve()) and config.model_ref == str(checkpoint)
    assert config.port == 9001 and config.api_keys == ("k",)
    assert config.sampling.temperature == 0.0 and config.sampling.top_p is None
    assert config.model_alias == "a"


# ---- --help ----------------------------------------------------------------

def _invocation(opt) -> str:  # type: ignore[no-untyped-def]
    text = ", ".join(opt.all_spellings)
    return f"{text} {opt.metavar}" if opt.metavar else text


def test_help_lists_each_visible_option_once_and_no_hidden_one() -> None:
    run = run_cli(["--help"])
    assert run.rc == 0 and run.stderr == ""
    lines = run.stdout.splitlines()
    for opt in OPTIONS:
        hits = [ln for ln in lines if ln.strip().startswith(_invocation(opt) + " ")
                or ln.strip() == _invocation(opt)]
        if opt.hidden:
            for spelling in opt.all_spellings:
                token = re.compile(rf"(?<![\w-]){re.escape(spelling)}(?![\w-])")
                assert not token.search(run.stdout), spelling
        else:
            assert len(hits) == 1, opt.name
            if opt.env:
                assert f"(env: {opt.env})" in run.stdout
            if opt.shown_default():
                flat = " ".join(run.stdout.split())
                assert f"(default: {opt.shown_default()})" in flat, opt.name


@pytest.mark.parametrize("spelling", ["-t", "-ngl", "-fa", "--mlock", "--numa", "--swa-full"])
def test_help_lists_the_accepted_no_effect_options_marked_as_such(spelling: str) -> None:
    # upstream lists them; `--help | grep ngl` must not suggest they are refused
    run = run_cli(["--help"])
    (opt,) = [o for o in OPTIONS if spelling in o.all_spellings]
    block = run.stdout.split(_invocation(opt), 1)[1].split("\n  -", 1)[0]
    assert "[accepted; no effect on MLX]" in block, block


def test_every_tuning_option_is_listed_and_marked() -> None:
    tuning = [o for o in OPTIONS if o.quiet is not None]
    assert len(tuning) > 10
    for opt in tuning:
        assert not opt.hidden, opt.name
        assert help_text(opt).count("[accepted; no effect on MLX]") == 1, opt.name


def test_help_text_carries_default_and_env() -> None:
    (port,) = [o for o in OPTIONS if o.dest == "port"]
    assert help_text(port) == "TCP port to listen on (default: 8080)\n(env: LLAMA_ARG_PORT)"


def _option_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("  ")]


def test_mlxcel_serve_help_matches_mlxcel_server_help() -> None:
    server = run_cli(["--help"], script="mlxcel-server")
    serve = run_cli(["serve", "--help"], script="mlxcel")
    assert server.rc == serve.rc == 0
    assert _option_lines(server.stdout) == _option_lines(serve.stdout)
    assert serve.stdout.startswith("usage: mlxcel serve [options]")


def test_mlxcel_help_lists_serve() -> None:
    run = run_cli(["--help"], script="mlxcel")
    assert run.rc == 0 and re.search(r"^\s+serve\s", run.stdout, re.M)


@pytest.mark.parametrize(("args", "rc"), [([], 1), (["bogus"], 1)])
def test_mlxcel_without_a_known_command_fails(args: list[str], rc: int, capsys) -> None:  # type: ignore[no-untyped-def]
    assert entry.mlxcel_main(args) == rc
    err = capsys.readouterr().err
    assert "serve" in err


# ---- --version, --dump-flag-surface ----------------------------------------

def test_version_line() -> None:
    run = run_cli(["--version"])
    assert run.rc == 0
    assert re.fullmatch(r"version: \S+ \(mlxcel-trio\)", run.stderr_lines[0])


def test_dump_flag_surface_round_trips_the_table() -> None:
    run = run_cli(["--dump-flag-surface"])
    assert run.rc == 0
    dump = json.loads(run.stdout)
    assert dump["schema_version"] == 1
    surface = dump["options"]
    want = sorted((json.loads(json.dumps(option_record(o))) for o in OPTIONS),
                  key=lambda r: r["name"])
    assert surface == want
    assert [r["name"] for r in surface] == sorted(r["name"] for r in surface)
    assert run.stdout == json.dumps(dump, indent=2, sort_keys=True) + "\n"  # stable text
    by_dest = {rec["dest"]: rec for rec in surface}
    assert by_dest["dump_flag_surface"]["hidden"] is True
    assert by_dest["n_parallel"]["spellings"] == ["-np", "--parallel"]
    assert by_dest["n_parallel"]["env"] == ["LLAMA_ARG_N_PARALLEL"]
    assert by_dest["n_parallel"]["default"] == -1 and by_dest["n_parallel"]["takes_value"]
    assert by_dest["warmup"]["spellings"] == ["--warmup", "--no-warmup"]
    assert by_dest["warmup"]["negations"] == ["--no-warmup"]
    assert by_dest["sampling.temperature"]["default"] is None
    assert by_dest["sampling.temperature"]["status"] == "by_design"


def test_dump_flag_surface_record_shape() -> None:
    by_name = {r["name"]: r for r in json.loads(run_cli(["--dump-flag-surface"]).stdout)["options"]}
    assert set(by_name["--gpu-layers"]) == {
        "name", "spellings", "negations", "dest", "kind", "takes_value", "nargs", "metavar",
        "domain", "env", "env_negated", "default", "default_text", "hidden", "section",
        "status", "owner_issue", "accepts", "refuses", "checked_after_model", "upstream"}
    ngl = by_name["--gpu-layers"]
    assert ngl["spellings"] == ["-ngl", "--gpu-layers", "--n-gpu-layers"]
    assert ngl["status"] == "not_applicable" and ngl["owner_issue"] == 3
    assert not ngl["hidden"] and ngl["checked_after_model"] and ngl["default"] == "auto"
    kv = by_name["--kv-offload"]
    assert kv["env"] == ["LLAMA_ARG_KV_OFFLOAD", "LLAMA_ARG_NO_KV_OFFLOAD"]
    assert kv["env_negated"] == "LLAMA_ARG_NO_KV_OFFLOAD"
    assert kv["negations"] == ["-nkvo", "--no-kv-offload"] and kv["default"] is True
    rp = by_name["--repeat-penalty"]
    assert (rp["status"], rp["owner_issue"], rp["accepts"]) == ("supported", 5, None)
    gr = by_name["--grammar"]
    assert (gr["status"], gr["owner_issue"], gr["refuses"]) == ("by_design", 5, False)
    assert by_name["--control-vector-layer-range"]["nargs"] == 2
    assert by_name["--defrag-thold"]["refuses"] is False
    assert {r["owner_issue"] for r in by_name.values()} <= set(OWNERS)


def test_mlxcel_serve_dumps_the_same_surface() -> None:
    server = run_cli(["--dump-flag-surface"], script="mlxcel-server")
    serve = run_cli(["serve", "--dump-flag-surface"], script="mlxcel")
    assert server.rc == serve.rc == 0 and server.stdout == serve.stdout

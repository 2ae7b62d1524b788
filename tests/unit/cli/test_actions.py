"""--completion-bash, --cache-list and --list-devices: print and exit 0, no model needed."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from mlxcel_trio.cli.actions import cache_list, completion_bash
from mlxcel_trio.model_store import hub_cache_dir
from mlxcel_trio.cli.options import OPTIONS

from ._proc import run_cli

needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")


def _bash(script: str, words: list[str]) -> list[str]:
    """Run the completion function the script registers on `words`."""
    func = re.search(r"complete -F (\S+) ", script).group(1)  # type: ignore[union-attr]
    quoted = " ".join(f"'{w}'" for w in words)
    code = (f"{script}\nCOMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; "
            f'{func}; printf "%s\\n" "${{COMPREPLY[@]}}"')
    out = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return [ln for ln in out.stdout.splitlines() if ln]


@needs_bash
@pytest.mark.parametrize(("args", "script", "command"), [
    (["--completion-bash"], "mlxcel-server", "mlxcel-server"),
    (["serve", "--completion-bash"], "mlxcel", "mlxcel")])
def test_completion_script_is_valid_bash(args: list[str], script: str, command: str) -> None:
    run = run_cli(args, script=script)
    assert run.rc == 0 and run.stderr == ""
    check = subprocess.run(["bash", "-n"], input=run.stdout, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert re.search(rf"^complete -F \S+ {command}$", run.stdout, re.M)


def test_completion_lists_visible_options_only() -> None:
    script = completion_bash("mlxcel-server")
    opts = set(re.search(r'opts="([^"]*)"', script).group(1).split())  # type: ignore[union-attr]
    visible = {s for o in OPTIONS if not o.hidden for s in o.all_spellings}
    assert opts == visible
    assert {"-ngl", "--n-gpu-layers", "--mlock"} <= opts  # accepted, no effect on MLX
    for hidden in ("--control-vector",
                   "--log-prompts-dir", "--fim-qwen-7b-default", "--dump-flag-surface"):
        assert hidden not in opts


@needs_bash
def test_completion_completes_options_values_and_paths(tmp_path: Path) -> None:
    script = completion_bash("mlxcel-server")
    assert "--ctx-size" in _bash(script, ["mlxcel-server", "--ctx"])
    assert set(_bash(script, ["mlxcel-server", "--log-colors", ""])) == {"on", "off", "auto"}
    (tmp_path / "grammar.gbnf").write_text("x")
    got = _bash(script, ["mlxcel-server", "--grammar-file", f"{tmp_path}/gr"])
    assert got == [f"{tmp_path}/grammar.gbnf"]


@needs_bash
def test_serve_completion_offers_serve_first() -> None:
    script = completion_bash("mlxcel serve")
    assert "serve" in script.splitlines()[2]  # the header says what it registers for
    assert _bash(script, ["mlxcel", "se"]) == ["serve"]
    assert "--port" in _bash(script, ["mlxcel", "serve", "--po"])


def _snapshot(root: Path, repo: str, *files: str) -> None:
    snap = root / ("models--" + repo.replace("/", "--")) / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    for name in files:
        (snap / name).write_text("{}")


def test_cache_list_counts_mlx_checkpoints_only(tmp_path: Path) -> None:
    _snapshot(tmp_path, "mlx-community/Qwen3-0.6B-bf16", "config.json", "model.safetensors")
    _snapshot(tmp_path, "ggml-org/gemma-3-4b-it-GGUF", "gemma.gguf")
    _snapshot(tmp_path, "owner/half-download", "config.json")
    _snapshot(tmp_path, "a/b", "config.json", "model-00001-of-00002.safetensors")
    out = cache_list({"HF_HUB_CACHE": str(tmp_path)})
    assert out == ("number of models in cache: 2\n"
                   "   1. a/b\n"
                   "   2. mlx-community/Qwen3-0.6B-bf16\n")


def test_cache_list_as_a_process(tmp_path: Path) -> None:
    _snapshot(tmp_path / "hub", "o/n", "config.json", "w.safetensors")
    run = run_cli(["-cl"], HF_HOME=str(tmp_path))
    assert run.rc == 0 and run.stdout == "number of models in cache: 1\n   1. o/n\n"
    empty = run_cli(["--cache-list"], HF_HUB_CACHE=str(tmp_path / "nothing"))
    assert empty.rc == 0 and empty.stdout == "number of models in cache: 0\n"


@pytest.mark.parametrize(("env", "want"), [
    ({"HF_HUB_CACHE": "/a", "HF_HOME": "/b"}, "/a"),
    ({"HUGGINGFACE_HUB_CACHE": "/c"}, "/c"),
    ({"HF_HOME": "/b"}, "/b/hub"),
    ({"XDG_CACHE_HOME": "/x"}, "/x/huggingface/hub"),
    ({"HOME": "/h"}, "/h/.cache/huggingface/hub")])
def test_hub_cache_dir_precedence(env: dict[str, str], want: str) -> None:
    assert str(hub_cache_dir(env)) == want


def test_list_devices_prints_mlx_devices() -> None:
    """Upstream's shape, MLX's devices: the CPU is always there; exit 0."""
    proc = run_cli(["--list-devices"])
    assert proc.rc == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "Available devices:"
    assert any(re.fullmatch(r"  CPU0: .* \(\d+ MiB, \d+ MiB free\)", ln) for ln in lines[1:])
    assert all(re.fullmatch(r"  (CPU|GPU)\d+: .* \(\d+ MiB, \d+ MiB free\)", ln)
               for ln in lines[1:])

"""Options we do not act on: inert values start; tuning options (speed,
memory or placement inside GGML) start with any valid value and are named
once as having no effect; everything else is refused with one line naming
the option, why, and what to use instead, before the model reference
resolves, every problem of a command line in the same run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mlxcel_trio.cli.main import prepare
from mlxcel_trio.cli.options import OPTIONS, Option
from mlxcel_trio.cli.options_ui import PRESETS
from mlxcel_trio.cli.parser import CliError
from mlxcel_trio.cli.record import OWNERS

from ._upstream import HAVE_UPSTREAM, expect_accepted, ours, plausible, record_id, records
from .._checkpoint import fake_checkpoint


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    """A checkpoint directory whose config.json states 4 layers."""
    return fake_checkpoint(tmp_path / "ckpt", {"num_hidden_layers": 4})


def outcome(argv: list[str], model: Path, env: dict[str, str] | None = None) -> str | None:
    """None when the command line would start, else its one-line refusal."""
    try:
        prepare([*argv, "-m", str(model)], env=env or {})
    except CliError as exc:
        line = str(exc)
        assert "\n" not in line
        return line
    return None


ACCEPTED = [
    # GGML runtime: the spec's inert values
    ["-t", "0"], ["--threads", "-1"], ["-tb", "-4"], ["-C", ""], ["--cpu-strict", "0"],
    ["--prio", "0"], ["--poll", "50"], ["-fa", "on"], ["--flash-attn", "auto"],
    ["-ngl", "all"], ["-ngl", "auto"], ["-ngl", "-1"], ["-ngl", "4"], ["-ngl", "99"],
    ["-mg", "0"], ["-lm", "auto"], ["--load-mode", "mmap"], ["--mmap"],
    ["--no-direct-io"], ["-ndio"], ["--repack"], ["--no-repack"], ["-nr"],
    ["--kv-offload"], ["-kvo"], ["--op-offload"], ["--no-perf"], ["--n-cpu-moe", "0"],
    ["--fit", "off"], ["-bs"], ["--backend-sampling"], ["-dt", "0.1"], ["-dt", "-1"],
    ["-sm", "none"], ["-ctk", "f16"], ["-ctv", "f16"], ["-ctv", "bf16"],
    ["-ctk", "f32", "-ctv", "bf16"], ["-ctk", "q8_0", "-ctv", "q8_0"], ["-ctk", "q4_0", "-ctv", "iq4_nl"], ["-fitt", "1024"], ["-fitc", "4096"],
    # deprecated loaders yield to --load-mode
    ["--mlock", "-lm", "auto"], ["--no-mmap", "--load-mode", "mmap"],
    ["--direct-io", "-lm", "mmap"],
    # the web UI (served); tools / MCP: the forms asking for the state we are in
    ["--ui"], ["--webui"], ["--no-ui"], ["--no-webui"], ["--ui-config", "{}"],
    ["--webui-config", "{\"temperature\": 0}"],
    ["--no-agent"], ["-no-ag"], ["--no-ui-mcp-proxy"], ["--no-webui-mcp-proxy"], ["--path", ""],
    # multimodal
    ["--mmproj-auto"], ["--no-mmproj"], ["--no-mmproj-auto"], ["--mmproj-offload"],
    ["--image-min-tokens", "0"], ["--image-max-tokens", "-1"],
    ["--image-min-tokens", "64"], ["--image-max-tokens", "1024"],
    ["--mtmd-batch-max-tokens", "1024"],
    # control vectors: a layer range alone configures nothing
    ["--control-vector-layer-range", "1", "10"],
    # speculative
    ["--spec-type", "none"], ["-ctkd", "f16"], ["-ctvd", "f16"], ["-ctkd", "bf16"],
    ["-ngld", "all"], ["-ngld", "auto"], ["--spec-draft-n-max", "3"],
    ["--spec-ngram-mod-n-min", "48"], ["-td", "0"], ["--spec-type", "none,ngram-simple"],
    ["--spec-draft-backend-sampling"], ["--spec-draft-p-min", "0"],
    ["--spec-type", "ngram-simple"], ["--spec-ngram-simple-size-n", "3"],
    ["--spec-type", "ngram-mod,ngram-map-k,ngram-map-k4v"], ["--spec-ngram-mod-n-min", "7"],
    # runtime and context
    ["-ub", "128"], ["--cache-reuse", "0"], ["--cache-reuse", "256"], ["-sps", "0"], ["-no-kvu"],
    ["--no-kv-unified"], ["-ctxcp", "0"], ["--no-cache-idle-slots"], ["--cache-idle-slots"], ["-cram", "0"],
    ["-cram", "8192"], ["-cram", "-1"], ["-cms", "8192"], ["--cache-prompt"],
    ["--no-cache-prompt"], ["-cb"], ["--no-context-shift"],
    ["--keep", "0"],
    # deferred defaults elsewhere
    ["--repeat-penalty", "1.0"], ["--samplers",
     "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature"],
    ["--jinja"], ["--chat-template-kwargs", "{ }"], ["--slots"], ["--cors-origins", "*"],
    ["--api-prefix", ""], ["--threads-http", "0"], ["--sleep-idle-seconds", "-5"],
    ["--log-colors", "auto"], ["-lv", "3"], ["--escape"], ["--embd-normalize", "2"],
]

REFUSED = [
    (["--rpc", "h:1"], "--rpc"), (["--perf"], "--perf"),
    (["-fit", "on"], "--fit 'on'"), (["--check-tensors"], "--check-tensors"), (["-ctk", "q8_0"], "--cache-type-k 'q8_0': K as q8_0"),
    (["-ctk", "q8_0", "-ctv", "q4_0"], "--cache-type-k 'q8_0', --cache-type-v 'q4_0': K as q8_0"),
    (["--override-kv", "a=int:1"], "--override-kv"),
    (["-mu", "https://example.com/m.gguf"], "--model-url"), (["-dr", "gemma3"], "--docker-repo"),
    (["-hff", "m-Q4_K_M.gguf"], "--hf-file"),
    (["--path", "/srv"], "--path"),
    (["--tools", "all"], "--tools"), (["--tools-runtime", "docker:x"], "--tools-runtime"),
    (["--mcp-servers-config", "m.json"], "--mcp-servers-config"),
    (["--mcp-servers-json", "{}"], "--mcp-servers-json"), (["--ui-mcp-proxy"], "--ui-mcp-proxy"),
    (["--webui-mcp-proxy"], "--ui-mcp-proxy"), (["--agent"], "--agent"), (["-ag"], "--agent"),
    (["-mm", "p.gguf"], "--mmproj"), (["-mmu", "https://x/p.gguf"], "--mmproj-url"),
    (["--no-mmproj-offload"], "--no-mmproj-offload"), (["-mmdev", "x"], "--mmproj-device"),
    (["--mtmd-batch-max-tokens", "512"], "--mtmd-batch-max-tokens"),
    (["--control-vector", "v.gguf"], "--control-vector"),
    (["--control-vector-scaled", "v.gguf:0"], "--control-vector-scaled"),
    (["--spec-type", "draft-mtp"], "MLX checkpoints do not carry"),
    (["--spec-type", "ngram-cache", "-lcs", "/nonexistent/c.bin"],
     "'/nonexistent/c.bin': failed to open lookup cache"),
    (["-hfd", "a/b"], "--spec-draft-hf"),
    (["-ngld", "99"], "--spec-draft-ngl"), (["-ctkd", "q4_0"], "model's own float type"),
    (["--draft", "3"], ("the argument has been removed; use --spec-draft-n-max or "
                        "--spec-ngram-mod-n-max")),
    (["--draft-min", "0"], "the argument has been removed"),
    (["--spec-ngram-size-n", "3"], "use the respective --spec-ngram-*-size-n"),
    (["--no-spec-draft-backend-sampling"], "--no-spec-draft-backend-sampling"),
    (["-devd", "x"], "--spec-draft-device"), (["-cmoed"], "--spec-draft-cpu-moe"),
    (["-sps", "0.1"], "no slot keeps a prompt"), (["-ctxcp", "32"], "no context checkpoints"), (["-cms", "256"], "no context checkpoints"),
    (["--log-prompts-dir", "/tmp/prompts"], "--log-prompts-dir"),
    (["-hf", "ggml-org/x-GGUF:Q4_K_M"], "GGUF"),
]


@pytest.mark.parametrize("argv", ACCEPTED, ids=" ".join)
def test_inert_values_are_accepted(argv: list[str], ckpt: Path) -> None:
    assert outcome(argv, ckpt) is None


@pytest.mark.parametrize(("argv", "needle"), REFUSED, ids=lambda x: " ".join(x)
                         if isinstance(x, list) else None)
def test_other_values_are_refused_in_one_line(argv: list[str], needle: str, ckpt: Path) -> None:
    line = outcome(argv, ckpt)
    assert line is not None and needle in line
    assert "; " in line  # why; what to use instead


@pytest.mark.parametrize("argv", [r[0] for r in REFUSED if r[0][0] not in ("-ngl",)],
                         ids=" ".join)
def test_refusals_come_before_the_model_is_resolved(argv: list[str]) -> None:
    # An uncached, unreachable repo id: resolving it would be a different error.
    with pytest.raises(CliError) as err:
        prepare([*argv, "-m", "nobody-xyz/not-a-repo"], env={"HF_HUB_OFFLINE": "1"})
    assert "nobody-xyz" not in str(err.value)


# ---- tuning options: accepted, and named once at startup ---------------------

TUNING = [
    (["-t", "8"], "--threads '8'"), (["-tb", "2"], "--threads-batch '2'"),
    (["-fa", "off"], "--flash-attn 'off'"), (["-ts", "3,1"], "--tensor-split '3,1'"),
    (["--mlock"], "--mlock"), (["-lm", "mlock"], "--load-mode 'mlock'"),
    (["-lm", "none"], "--load-mode 'none'"), (["-dev", "Metal"], "--device 'Metal'"),
    (["-nkvo"], "--no-kv-offload"), (["--numa", "distribute"], "--numa 'distribute'"),
    (["--no-mmap"], "--no-mmap"), (["--direct-io"], "--direct-io"),
    (["--cpu-moe"], "--cpu-moe"), (["-ncmoe", "2"], "--n-cpu-moe '2'"),
    (["--no-host"], "--no-host"), (["-mg", "1"], "--main-gpu '1'"),
    (["--no-op-offload"], "--no-op-offload"), (["-ot", "x=CPU"], "--override-tensor 'x=CPU'"),
    (["-C", "ff"], "--cpu-mask 'ff'"), (["-Cr", "0-3"], "--cpu-range '0-3'"),
    (["--poll", "0"], "--poll '0'"), (["--prio", "2"], "--prio '2'"),
    (["-ngl", "3"], "--gpu-layers '3'"), (["-ngl", "99"], "--gpu-layers '99'"),
    (["--swa-full"], "--swa-full"), (["--no-repack"], "--no-repack"),
]


def noted(argv: list[str], model: Path, env: dict[str, str] | None = None) -> tuple[str, ...]:
    return prepare([*argv, "-m", str(model)], env=env or {}).no_effect


@pytest.mark.parametrize(("argv", "shown"), TUNING, ids=lambda x: " ".join(x)
                         if isinstance(x, list) else None)
def test_tuning_values_start_and_are_named_once(argv: list[str], shown: str,
                                                ckpt: Path) -> None:
    assert noted(argv, ckpt) == (shown,)


@pytest.mark.parametrize("argv", [["-t", "0"], ["-fa", "on"], ["-ngl", "all"], ["-ngl", "-1"],
                                  ["--mmap"], ["-lm", "auto"], ["-sm", "none"], ["-mg", "0"],
                                  ["--poll", "50"], ["--repack"]], ids=" ".join)
def test_neutral_tuning_values_are_not_named(argv: list[str], ckpt: Path) -> None:
    assert noted(argv, ckpt) == ()


def test_an_upstream_tuning_command_line_starts(ckpt: Path) -> None:
    argv = ["-c", "8192", "-ngl", "99", "-fa", "on", "--mlock", "-np", "4", "--jinja",
            "-t", "8", "--no-mmap", "--numa", "distribute", "-ctk", "q8_0", "-ctv", "q8_0"]
    config = prepare([*argv, "-m", str(ckpt)], env={})
    assert config.no_effect == ("--threads '8'", "--mlock", "--no-mmap", "--numa 'distribute'",
                                "--gpu-layers '99'")
    assert (config.cache_type_k, config.cache_type_v) == ("q8_0", "q8_0")


def test_tuning_from_the_environment_names_the_variable(ckpt: Path) -> None:
    env = {"LLAMA_ARG_THREADS": "8", "LLAMA_ARG_N_GPU_LAYERS": "99", "LLAMA_ARG_MLOCK": "1",
           "LLAMA_ARG_NO_MMAP": "1", "LLAMA_ARG_NUMA": "distribute", "LLAMA_ARG_FLASH_ATTN": "on",
           "LLAMA_ARG_CACHE_TYPE_K": "q8_0", "LLAMA_ARG_CACHE_TYPE_V": "q8_0"}
    config = prepare(["-m", str(ckpt)], env=env)
    assert (config.cache_type_k, config.cache_type_v) == ("q8_0", "q8_0")
    assert set(noted([], ckpt, env)) == {
        "--threads '8' (from LLAMA_ARG_THREADS)", "--mlock (from LLAMA_ARG_MLOCK)",
        "--no-mmap (from LLAMA_ARG_NO_MMAP)", "--numa 'distribute' (from LLAMA_ARG_NUMA)",
        "--gpu-layers '99' (from LLAMA_ARG_N_GPU_LAYERS)"}


def test_a_tuning_value_outside_its_domain_is_still_an_error(ckpt: Path) -> None:
    line = outcome(["--prio", "7"], ckpt)
    assert line is not None and "--prio" in line


def test_every_problem_of_a_command_line_is_reported_in_one_run(ckpt: Path) -> None:
    with pytest.raises(CliError) as err:
        prepare(["-m", str(ckpt), "-ctk", "q8_0", "--perf", "--rpc", "h:1", "--bogus",
                 "--prio", "9"], env={"LLAMA_ARG_CACHE_TYPE_V": "q4_0"})
    lines = err.value.lines
    for needle in ("--bogus", "--perf", "--rpc",
                   "--cache-type-k 'q8_0', --cache-type-v 'q4_0' (from LLAMA_ARG_CACHE_TYPE_V)"):
        assert sum(needle in line for line in lines) == 1, (needle, lines)


def test_refusals_and_value_errors_travel_together(ckpt: Path) -> None:
    with pytest.raises(CliError) as err:
        prepare(["-m", str(ckpt), "--prio", "9", "-n", "x"], env={})
    assert len(err.value.lines) == 2, err.value.lines


# ---- environment rules ------------------------------------------------------

@pytest.mark.parametrize(("env", "refused"), [
    ({"LLAMA_ARG_CPU_MOE": "0"}, False), ({"LLAMA_ARG_CPU_MOE": "yes"}, False),
    ({"LLAMA_ARG_CPU_MOE": "1"}, False), ({"LLAMA_ARG_CPU_MOE": "on"}, False),
    ({"LLAMA_ARG_UI": "false"}, False), ({"LLAMA_ARG_UI": "0"}, False),
    ({"LLAMA_ARG_UI": "true"}, False), ({"LLAMA_ARG_NO_UI": "1"}, False),
    ({"LLAMA_ARG_NO_UI": "1", "LLAMA_ARG_UI": "1"}, False),
    ({"LLAMA_ARG_AGENT": "enabled"}, True), ({"LLAMA_ARG_NO_AGENT": "0"}, False),
    ({"LLAMA_ARG_UI_MCP_PROXY": "off"}, False), ({"LLAMA_ARG_UI_MCP_PROXY": "on"}, True),
    ({"LLAMA_ARG_NO_UI_MCP_PROXY": "x"}, False),
    ({"LLAMA_ARG_THREADS": "8"}, False), ({"LLAMA_ARG_THREADS": "0"}, False),
    ({"LLAMA_ARG_NO_MMAP": "1"}, False), ({"LLAMA_ARG_MMAP": "true"}, False),
    ({"LLAMA_ARG_NO_MMAP": "1", "LLAMA_ARG_LOAD_MODE": "mmap"}, False),
    ({"LLAMA_ARG_NO_PERF": "1"}, False), ({"LLAMA_ARG_PERF": "1"}, True),
    ({"LLAMA_ARG_NO_CACHE_PROMPT": "1"}, False), ({"LLAMA_ARG_CACHE_PROMPT": "1"}, False),
    ({"MTMD_BACKEND_DEVICE": "cpu"}, True), ({"HF_TOKEN": ""}, False),
    ({"HF_TOKEN": "hf_abc"}, False), ({"LLAMA_ARG_ENDPOINT_METRICS": "0"}, False),
    ({"LLAMA_ARG_ENDPOINT_METRICS": "1"}, False),  # served since #6
])
def test_environment_follows_upstreams_rules(env: dict[str, str], refused: bool,
                                             ckpt: Path) -> None:
    line = outcome([], ckpt, env)
    assert (line is not None) == refused, line
    if refused:
        assert "(from " in line


@pytest.mark.parametrize("var", ["LLAMA_ARG_PERF", "LLAMA_ARG_UI", "LLAMA_ARG_KV_UNIFIED"])
def test_bool_pair_variable_outside_the_vocabulary_stops_startup(var: str, ckpt: Path) -> None:
    line = outcome([], ckpt, {var: "sometimes"})
    assert line is not None and "invalid value 'sometimes'" in line and var in line


# ---- presets, --log-prompts-dir ---------------------------------------------

@pytest.mark.parametrize(("flag", "repo"), PRESETS.items())
def test_presets_are_refused_naming_the_mlx_checkpoint(flag: str, repo: str | None,
                                                       ckpt: Path) -> None:
    line = outcome([flag], ckpt)
    assert line is not None and line.startswith(f"{flag}: ")
    if repo is None:
        assert "speculative" in line
    else:
        assert f"use --model {repo}" in line and repo.startswith("mlx-community/")


def test_presets_are_hidden() -> None:
    hidden = {o.name for o in OPTIONS if o.hidden}
    assert set(PRESETS) <= hidden and len(PRESETS) == 12


def test_log_prompts_dir_is_refused_without_creating_it(tmp_path: Path, ckpt: Path) -> None:
    target = tmp_path / "prompts"
    line = outcome(["--log-prompts-dir", str(target)], ckpt)
    assert line is not None and "--verbose" in line and not target.exists()


# ---- table-wide invariants --------------------------------------------------

def test_not_applicable_options_are_classified_and_only_tuning_ones_shown() -> None:
    for opt in OPTIONS:
        if opt.status == "not_applicable":
            # classified: refused unless inert (hidden), or a tuning option
            # (never refused; listed in --help as upstream, marked no effect)
            assert (opt.refuse is None) == (opt.quiet is not None), opt.name
            assert opt.hidden == (opt.quiet is None), opt.name
        if opt.status == "deferred":
            assert not opt.hidden and opt.refuse is not None, opt.name
            assert opt.owner in OWNERS, opt.name


def _default_argv(opt: Option) -> list[str] | None:
    """The command line giving an option its own default, or None."""
    if opt.default is None or opt.kind == "flag":
        return None
    if opt.kind == "bool":
        return [opt.name] if opt.default else [str(opt.negation_name)]
    return [opt.name, str(opt.default)]


# These accept only the value that turns them off; their upstream default
# asks for per-slot behaviour that does not exist here.
NEUTRAL_ONLY = {"--slot-prompt-similarity", "--ctx-checkpoints"}
DEFERRED = [o for o in OPTIONS if o.status == "deferred"]


@pytest.mark.parametrize("opt", [o for o in DEFERRED if _default_argv(o)
                                 and o.name not in NEUTRAL_ONLY], ids=lambda o: o.name)
def test_deferred_options_accept_their_default(opt: Option, ckpt: Path) -> None:
    assert outcome(_default_argv(opt) or [], ckpt) is None


@pytest.mark.skipif(not HAVE_UPSTREAM, reason="../shared reference data absent")
@pytest.mark.parametrize("rec", [r for r in records() if ours(r).status == "deferred"
                                 and not expect_accepted(r)], ids=record_id)
def test_deferred_options_refuse_another_value_as_not_implemented(
    rec: dict[str, Any], tmp_path: Path, ckpt: Path
) -> None:
    opt = ours(rec)
    some_file = tmp_path / "f.txt"
    some_file.write_text("x")
    line = outcome(plausible(rec, some_file, ckpt), ckpt)
    assert line is not None and line.startswith(opt.name if opt.kind != "bool"
                                                else (opt.negation_name, opt.name))
    assert "not implemented yet in mlxcel-trio; " in line and "#" not in line


def test_hf_advice_tells_a_gguf_repository_from_an_mlx_one(ckpt: Path) -> None:
    gguf = outcome(["-hf", "ggml-org/gemma-3-1b-it-GGUF:Q4_K_M"], ckpt) or ""
    assert "is a GGUF repository" in gguf and "--hf-repo mlx-community/gemma-3-1b-it-bf16" in gguf
    assert "--hf-repo ggml-org/gemma-3-1b-it-GGUF" not in gguf
    mlx = outcome(["-hf", "mlx-community/Qwen3-0.6B-bf16:Q4_K_M"], ckpt) or ""
    assert "use --hf-repo mlx-community/Qwen3-0.6B-bf16 if it holds MLX" in mlx

"""The option table: its own invariants, its agreement with ServerConfig, and
(when the reference data is checked out next to the repo) with upstream."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from mlxcel_trio.cli.options import OPTIONS, Option, check_table
from mlxcel_trio.cli.values import Int
from mlxcel_trio.config import RopeOverrides, SamplingDefaults, ServerConfig

REPO = Path(__file__).resolve().parents[3]
UPSTREAM = REPO.parent / "shared" / "upstream" / "llama-server" / "options.json"
LIVE = ("supported", "aliased", "by_design")


def _config_default(dest: str) -> object:
    head, _, tail = dest.partition(".")
    if head == "sampling":
        return attrs.fields_dict(SamplingDefaults)[tail].default
    if head == "rope":
        return attrs.fields_dict(RopeOverrides)[tail].default
    return attrs.fields_dict(ServerConfig)[dest].default


def test_table_is_consistent() -> None:
    check_table(OPTIONS)


def test_duplicate_spelling_is_refused() -> None:
    a = Option(("-x", "--ex"), "a", "a", value=Int(), metavar="N")
    b = Option(("--ex",), "b", "b", kind="flag")
    with pytest.raises(ValueError, match="--ex"):
        check_table((a, b))


def test_duplicate_env_including_the_implicit_negation_is_refused() -> None:
    a = Option(("--thing",), "a", "a", kind="bool", negations=("--no-thing",),
               env="LLAMA_ARG_THING")
    b = Option(("--other",), "b", "b", value=Int(), metavar="N", env="LLAMA_ARG_NO_THING")
    with pytest.raises(ValueError, match="LLAMA_ARG_NO_THING"):
        check_table((a, b))


def test_record_shape_is_checked_when_built() -> None:
    with pytest.raises(ValueError):
        Option(("--x",), "x", "x")  # a value option without a domain
    with pytest.raises(ValueError):
        Option(("--x",), "x", "x", kind="flag", negations=("--no-x",))
    with pytest.raises(ValueError):
        Option(("x",), "x", "x", kind="flag")


def test_implicit_negated_env_name() -> None:
    opt = Option(("--cache-prompt",), "c", "c", kind="bool",
                 negations=("--no-cache-prompt",), env="LLAMA_ARG_CACHE_PROMPT")
    assert opt.env_negated == "LLAMA_ARG_NO_CACHE_PROMPT"
    flag = Option(("--x",), "x", "x", kind="flag", env="LLAMA_ARG_X")
    assert flag.env_negated is None


@pytest.mark.parametrize("opt", [o for o in OPTIONS if o.kind != "action" and o.status in LIVE],
                         ids=lambda o: o.name)
def test_live_option_lands_in_a_config_field_with_the_same_default(opt: Option) -> None:
    if opt.dest in ("model", "hf_token", "hf_repo"):
        return  # consumed while resolving the model, not ServerConfig fields
    assert opt.default == _config_default(opt.dest)


def test_by_design_sampling_defaults_are_absent() -> None:
    for dest in ("sampling.temperature", "sampling.top_k", "sampling.top_p"):
        (opt,) = [o for o in OPTIONS if o.dest == dest]
        assert opt.status == "by_design" and opt.default is None
        assert "generation_config.json" in (opt.default_text or "")


def test_no_table_module_is_long() -> None:
    for path in (REPO / "mlxcel_trio" / "cli").glob("*.py"):
        assert len(path.read_text().splitlines()) <= 400, path


def test_runtime_never_reads_the_reference_data() -> None:
    for path in (REPO / "mlxcel_trio" / "cli").glob("*.py"):
        assert "upstream/llama-server" not in path.read_text(), path


@pytest.mark.skipif(not UPSTREAM.exists(), reason="reference data not checked out")
@pytest.mark.parametrize("opt", [o for o in OPTIONS if o.upstream], ids=lambda o: o.name)
def test_upstream_spellings_env_and_default(opt: Option) -> None:
    records = json.loads(UPSTREAM.read_text())["options"]
    if opt.name == "--rpc":
        return  # registered upstream only in RPC-enabled builds; see test_inventory
    (rec,) = [r for r in records if opt.spellings[0] in r["spellings"]]
    assert sorted(opt.all_spellings) == sorted(rec["spellings"])
    assert [e for e in [opt.env] if e] == rec["env"]
    assert opt.env_negated == rec.get("env_negated_alias_accepted")
    assert (opt.metavar or None) == rec["value_hint"]
    if rec["default"] is not None:
        assert rec["default"].split(",")[0] in (opt.shown_default() or "")

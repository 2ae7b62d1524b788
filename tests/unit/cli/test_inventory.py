"""Our table against upstream's inventory (options.json): every spelling of
every help entry (plus --rpc) parses, on both entry points, to its own
option; every environment variable binds; nothing is added or missing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mlxcel_trio.cli.options import OPTIONS
from mlxcel_trio.cli.parser import parse

from ._upstream import (
    BY_SPELLING,
    needs_upstream,
    ours,
    plausible,
    record_id,
    records,
    upstream,
)

pytestmark = needs_upstream
PROGS = ["mlxcel-server", "mlxcel serve"]
RECORDS = records()
SPELLINGS = [(rec, s) for rec in RECORDS for s in rec["spellings"]]


def _argv(rec: dict[str, Any], spelling: str, tmp_path: Path) -> list[str]:
    """`spelling` with the value `plausible` would give the option."""
    f = tmp_path / "some.file"
    f.write_text("x")
    _, *value = plausible(rec, f, tmp_path)
    opt = ours(rec)
    if opt.kind != "value":
        return [spelling]
    return [spelling, *value]


def test_every_upstream_entry_is_in_the_table() -> None:
    data = upstream()
    assert len(RECORDS) == data["counts"]["help_entries"] + 1  # + --rpc
    matched = {id(ours(rec)) for rec in RECORDS}
    assert len(matched) == len(RECORDS)  # one option per entry
    upstream_only = [o for o in OPTIONS if id(o) not in matched]
    # mlxcel-trio's own options: the flag-surface dump (hidden), the
    # spec's native --reasoning-alias-field policy, the CPU runtime
    # choices (--blas, --weights), the side encoders (--embedding-model,
    # --reranker-model), the media budgets (--max-image-payload-size,
    # --max-images), the replicas' shared --session-store and the prompt
    # cache's disk tier (--cache-disk, --cache-disk-mib)
    assert sorted(o.name for o in upstream_only) == [
        "--blas", "--cache-disk", "--cache-disk-mib", "--dump-flag-surface", "--embedding-model", "--max-image-payload-size",
        "--max-images", "--model-store-root", "--reasoning-alias-field", "--reranker-model",
        "--session-store", "--weights"]
    assert all(not o.upstream for o in upstream_only)
    assert [o.name for o in upstream_only if o.hidden] == ["--dump-flag-surface"]


def test_no_spelling_or_variable_upstream_lacks() -> None:
    data = upstream()
    theirs = set(data["long_spellings"]) | set(data["short_spellings"]) | {"--rpc"}
    mine = {s for o in OPTIONS for s in o.all_spellings}
    assert mine - theirs == {"--dump-flag-surface", "--reasoning-alias-field",  # ours
                             "--blas", "--weights", "--embedding-model", "--reranker-model",
                             "--model-store-root", "--max-image-payload-size", "--max-images",
                             "--session-store", "--cache-disk", "--cache-disk-mib"}
    assert theirs - mine == set()
    envs = {e for o in OPTIONS for e in (o.env, o.env_negated) if e}
    want = (set(data["env_vars_named_in_help"]) | set(data["implicit_LLAMA_ARG_NO_env_aliases"])
            | {"LLAMA_ARG_RPC"})
    assert envs == want | {"MLXCEL_BLAS", "MLXCEL_WEIGHTS", "MLXCEL_MODELS_DIR",  # ours
                           "MLXCEL_SESSION_STORE", "MLXCEL_CACHE_DISK", "MLXCEL_CACHE_DISK_MIB"}


@pytest.mark.parametrize("rec", RECORDS, ids=record_id)
def test_record_facts(rec: dict[str, Any]) -> None:
    opt = ours(rec)
    cpp = rec["arg_cpp"]
    assert list(opt.spellings) == cpp["args"] and list(opt.negations) == cpp["args_neg"]
    assert [e for e in [opt.env] if e] == rec["env"]
    assert opt.env_negated == rec.get("env_negated_alias_accepted")
    assert opt.metavar == rec["value_hint"]
    assert opt.takes_value == (rec["value_hint"] is not None)
    if rec["default"] is not None:
        assert rec["default"].split(",")[0] in (opt.shown_default() or ""), opt.name


@pytest.mark.parametrize("prog", PROGS)
@pytest.mark.parametrize(("rec", "spelling"), SPELLINGS,
                         ids=lambda x: x if isinstance(x, str) else record_id(x))
def test_every_spelling_parses_to_its_own_option(
    rec: dict[str, Any], spelling: str, prog: str, tmp_path: Path
) -> None:
    opt = ours(rec)
    parsed = parse(_argv(rec, spelling, tmp_path), env={}, prog=prog)
    if opt.kind == "action":
        assert parsed.action == opt.dest
        return
    assert dict(parsed.given) == {opt.dest: "argv"}  # nothing else was set: no shadowing
    if spelling in opt.negations:
        assert parsed.values[opt.dest] is False
    elif opt.kind in ("flag", "bool"):
        assert parsed.values[opt.dest] is True


def test_single_dash_spellings_are_upstreams_84() -> None:
    singles = {s for s in BY_SPELLING if not s.startswith("--")}
    assert singles == set(upstream()["short_spellings"])


@pytest.mark.parametrize(("short", "longer"), [
    ("-n", "-ngl"), ("-c", "-cb"), ("-c", "-cl"), ("-t", "-tb"), ("-m", "-mm"),
    ("-C", "-Cr"), ("-j", "-jf"), ("-r", "-rea"), ("-s", "-sp"), ("-s", "-sps")])
def test_a_longer_single_dash_spelling_is_not_a_short_one_with_a_value(
    short: str, longer: str
) -> None:
    opt = BY_SPELLING[longer]
    argv = [longer] if opt.kind != "value" else [longer, *(["1"] * opt.nargs)]
    if opt.dest == "chat_reasoning":
        argv = [longer, "on"]
    parsed = parse(argv, env={})
    assert BY_SPELLING[short].dest not in parsed.given


def _env_text(rec: dict[str, Any], tmp_path: Path) -> str:
    opt = ours(rec)
    if opt.kind == "flag":
        return "1"
    if opt.kind == "bool":
        return "false" if opt.default else "true"
    return " ".join(_argv(rec, opt.name, tmp_path)[1:])


@pytest.mark.parametrize("rec", [r for r in RECORDS if r["env"]], ids=lambda r: r["env"][0])
def test_every_upstream_variable_binds(rec: dict[str, Any], tmp_path: Path) -> None:
    opt = ours(rec)
    (var,) = rec["env"]
    parsed = parse([], env={var: _env_text(rec, tmp_path)})
    assert dict(parsed.given) == {opt.dest: var}


@pytest.mark.parametrize("alias", upstream()["implicit_LLAMA_ARG_NO_env_aliases"]
                         if RECORDS else [])
@pytest.mark.parametrize("text", ["1", "0", "anything"])
def test_implicit_negated_variables_mean_false(alias: str, text: str) -> None:
    (opt,) = [o for o in OPTIONS if o.env_negated == alias]
    parsed = parse([], env={alias: text, str(opt.env): "true"})
    assert parsed.values[opt.dest] is False and parsed.given[opt.dest] == alias

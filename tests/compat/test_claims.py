"""The manifest's claims against the live code, both ways, and the
acceptance cases: removing a flag from the parser, mounting an unclaimed
route, accepting an unclaimed field, or flipping a diverging entry to
supported must each fail a gate."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import attrs
import pytest

from mlxcel_trio.cli.options import OPTIONS
from mlxcel_trio.protocol.fields import NATIVE_FIELDS
from mlxcel_trio.protocol.routes import ROUTES, Route

from ._support import claims, copy_manifest, edit_entry, find_entry, lib, run_validator

SERVER, SERVE = lib.BINARIES


@cache
def entries() -> tuple[dict, ...]:
    return tuple(claims.load_entries(lib.MANIFEST_DIR))


def entry(eid: str) -> dict:
    (e,) = [e for e in entries() if e["id"] == eid]
    return e


def replaced(eid: str, **changes) -> list[dict]:
    """The manifest's entries with one entry changed (a deep-enough copy)."""
    out = []
    for e in entries():
        if e["id"] == eid:
            e = {**e, **changes}
        out.append(e)
    return out


def option(dest: str):
    (opt,) = [o for o in OPTIONS if o.dest == dest]
    return opt


# ---- the real code honours every claim ------------------------------------------

def test_option_claims_hold_on_both_entry_points() -> None:
    assert claims.option_problems(entries()) == []


def test_route_claims_hold() -> None:
    assert claims.route_problems(entries()) == []


def test_field_claims_hold() -> None:
    assert claims.field_problems(entries()) == []


def test_both_entry_points_dump_the_same_surface() -> None:
    dumps = claims.live_surfaces()
    assert dumps[SERVER] == dumps[SERVE]
    assert {r["name"] for r in dumps[SERVER]["options"]} >= {
        e["id"] for e in entries() if e["kind"] == "option" and e["mlxcel"]}


def test_every_option_entry_carries_a_claim_or_is_refused_by_both() -> None:
    parsers = claims.parsers(OPTIONS)
    for e in entries():
        if e["kind"] != "option" or e["mlxcel"] is not None:
            continue
        for parser in parsers.values():
            assert not set(e["spellings"]) & set(claims.option_strings(parser)), e["id"]


# ---- acceptance: the gates notice drift -------------------------------------------

def test_deleting_a_flag_from_the_parser_fails_the_option_check() -> None:
    table = tuple(o for o in OPTIONS if o.dest != "port")
    problems = claims.option_problems(entries(), table=table, check_env=False)
    assert f"option --port: {SERVER} does not accept claimed spelling --port" in problems
    assert f"option --port: {SERVE} does not accept claimed spelling --port" in problems


def test_an_unclaimed_spelling_on_the_parser_fails_the_option_check() -> None:
    port = option("port")
    table = tuple(attrs.evolve(o, spellings=(*o.spellings, "--listen-port")) if o is port else o
                  for o in OPTIONS)
    problems = claims.option_problems(entries(), table=table, check_env=False)
    assert any("also accepts --listen-port" in p for p in problems), problems


def test_an_entry_without_a_claim_must_be_refused_by_both_binaries() -> None:
    problems = claims.option_problems(replaced("--port", mlxcel=None), check_env=False)
    assert f"option --port: no claim, but {SERVER} accepts --port; flip the entry and claim " \
           "what is accepted" in problems
    assert any(p.startswith(f"{SERVE} accepts --port") for p in problems)


def test_a_claim_on_one_binary_only_is_checked_on_both() -> None:
    claim = {**entry("--port")["mlxcel"], "accepted_on_one_binary_only": SERVE}
    problems = claims.option_problems(replaced("--port", mlxcel=claim), check_env=False)
    assert f"option --port: {SERVER} accepts claimed spelling --port" in problems


def test_an_aliased_claim_resolves_on_our_spelling_and_not_on_upstreams() -> None:
    port = option("port")
    ours_only = tuple(attrs.evolve(o, spellings=("--listen-port",)) if o is port else o
                      for o in OPTIONS)
    claim = {**entry("--port")["mlxcel"], "accepted_spellings": ["--listen-port"]}
    aliased = replaced("--port", state="aliased", mlxcel=claim)
    assert claims.option_problems(aliased, table=ours_only, check_env=False) == []
    both = tuple(attrs.evolve(o, spellings=("--port", "--listen-port")) if o is port else o
                 for o in OPTIONS)
    problems = claims.option_problems(aliased, table=both, check_env=False)
    assert f"option --port: {SERVER} accepts upstream spelling --port, which the claim does " \
           "not list" in problems


def test_an_env_claim_must_bind() -> None:
    port = option("port")
    table = tuple(attrs.evolve(o, env=None) if o is port else o for o in OPTIONS)
    problems = claims.option_problems(entries(), table=table)
    assert any(p.startswith("option --port: claimed env ['LLAMA_ARG_PORT'] but the option "
                            "binds []") for p in problems), problems
    assert any("LLAMA_ARG_PORT did not set --port" in p for p in problems), problems


def test_a_changed_default_or_visibility_fails_the_option_check() -> None:
    port = option("port")
    table = tuple(attrs.evolve(o, default=9090, hidden=True) if o is port else o
                  for o in OPTIONS)
    problems = claims.option_problems(entries(), table=table, check_env=False)
    assert any(p.startswith("option --port: claimed defaults {'port': 8080}") for p in problems)
    assert any(p.startswith("option --port: claimed hidden=False") for p in problems)


def test_a_supported_option_may_not_refuse_values() -> None:
    deferred = next(e for e in entries() if e["kind"] == "option" and e["state"] == "deferred"
                    and e["mlxcel"] and "refused" in " ".join(e["divergence"]))
    problems = claims.option_problems(
        replaced(deferred["id"], state="supported", divergence=[]), check_env=False)
    assert f"option {deferred['id']}: supported, but the option refuses some values at " \
           "startup" in problems


def test_mounting_an_unclaimed_route_fails_the_route_check() -> None:
    problems = claims.route_problems(replaced("POST /models", mlxcel=None))
    assert "route POST /models: mounted, but the entry has no claim" in problems
    assert "ROUTES mounts POST /models but no manifest entry claims it" in problems


def test_mounting_a_route_upstream_lacks_fails_the_route_check() -> None:
    problems = claims.route_problems(entries(), routes=(*ROUTES, Route("GET", "/x", "health")))
    assert problems == ["ROUTES mounts GET /x but no manifest entry claims it"]


def test_unmounting_a_claimed_route_fails_the_route_check() -> None:
    routes = tuple(r for r in ROUTES if (r.method, r.path) != ("POST", "/tokenize"))
    problems = claims.route_problems(entries(), routes=routes)
    assert problems == ["route POST /tokenize: claims POST /tokenize, which ROUTES does not mount"]


def test_accepting_an_unclaimed_field_fails_the_field_check() -> None:
    from mlxcel_trio.protocol.fields import F

    problems = claims.field_problems(entries(), fields=(*NATIVE_FIELDS, F("id_slot", "int32")))
    assert problems == ["NATIVE_FIELDS accepts id_slot but no manifest entry claims it"]


def test_dropping_a_claimed_field_fails_the_field_check() -> None:
    fields = tuple(f for f in NATIVE_FIELDS if f.name != "n_indent")
    problems = claims.field_problems(entries(), fields=fields)
    assert problems == ["field n_indent: claims field 'n_indent', which NATIVE_FIELDS lacks"]


# A field whose entry records it as validated-then-ignored: "lora" as it was
# before adapters were implemented (every such entry has been implemented since).
WAS_IGNORED = "lora"


def _deferred_table(name: str) -> tuple:
    return tuple(attrs.evolve(f, status="deferred") if claims.field_path(f) == name else f
                 for f in NATIVE_FIELDS)


def test_implementing_a_field_without_flipping_its_entry_fails() -> None:
    stale = replaced(WAS_IGNORED, state="deferred", divergence=[lib.IGNORED_FIELD],
                     rationale=None)
    problems = claims.field_problems(stale)  # the table acts on it
    assert f"field {WAS_IGNORED}: NATIVE_FIELDS acts on it now, but the entry still says " \
           f"{lib.IGNORED_FIELD!r}; reclassify it" in problems


def test_an_ignored_field_is_never_supported() -> None:
    fields = _deferred_table(WAS_IGNORED)
    problems = claims.field_problems(
        replaced(WAS_IGNORED, state="supported", divergence=[], rationale=None), fields=fields)
    assert f"field {WAS_IGNORED}: state 'supported' but NATIVE_FIELDS marks it 'deferred'; " \
           "flip the entry (or the field) so they agree" in problems
    problems = claims.field_problems(
        replaced(WAS_IGNORED, state="deferred", divergence=["something else"], rationale=None),
        fields=fields)
    assert any(p.startswith(f"field {WAS_IGNORED}: NATIVE_FIELDS only validates it")
               for p in problems)


def test_changed_field_aliases_fail_the_field_check() -> None:
    fields = tuple(attrs.evolve(f, aliases=("max_tokens",)) if f.name == "n_predict" else f
                   for f in NATIVE_FIELDS)
    problems = claims.field_problems(entries(), fields=fields)
    assert any(p.startswith("field n_predict: claimed aliases") for p in problems), problems


def test_flipping_a_diverging_entry_to_supported_fails_the_validator(tmp_path: Path) -> None:
    m = copy_manifest(tmp_path)
    file, e = find_entry(m, lambda e: e["state"] in ("deferred", "by_design") and e["divergence"]
                         and e["mlxcel"] is not None)
    edit_entry(m, file, e["id"], lambda x: x.update(state="supported", rationale=None))
    run = run_validator(m)
    assert run.returncode == 1
    line = next(ln for ln in run.stdout.splitlines() if ln.startswith(f"{file}: {e['id']}: "))
    assert "state 'supported' with a non-empty divergence list" in line
    assert "aliased, not_applicable, deferred or by_design" in line


@pytest.mark.parametrize("kind", lib.KINDS)
def test_every_kind_is_present_and_claimed_where_accepted(kind: str) -> None:
    of_kind = [e for e in entries() if e["kind"] == kind]
    assert of_kind
    for e in of_kind:
        if e["state"] in ("supported", "aliased", "by_design"):
            assert e["mlxcel"] is not None, e["id"]


def test_every_mounted_route_is_claimed_upstream_or_as_mlxcel_only() -> None:
    every = entries()
    upstream = {(e["mlxcel"]["route"]["method"], e["mlxcel"]["route"]["path"])
                for e in every if e["kind"] == "route" and e["mlxcel"]}
    ours = {(e["method"], e["path"]) for e in every if e["kind"] == lib.EXTENSION_KIND}
    assert not upstream & ours
    assert {(r.method, r.path) for r in ROUTES} == upstream | ours
    assert claims.route_problems(every) == []


def test_dropping_an_mlxcel_only_claim_fails_the_route_check() -> None:
    kept = [e for e in entries() if e["id"] != "GET /v1/responses/:response_id"]
    assert claims.route_problems(kept) == [
        "ROUTES mounts GET /v1/responses/:response_id but no manifest entry claims it"]


def test_an_mlxcel_only_claim_of_an_unmounted_route_fails() -> None:
    routes = tuple(r for r in ROUTES if r.path != "/v1/responses/:response_id/cancel")
    assert claims.route_problems(entries(), routes=routes) == [
        "mlxcel-only route POST /v1/responses/:response_id/cancel: claims POST "
        "/v1/responses/:response_id/cancel, which ROUTES does not mount"]

"""The validator's own negative coverage: each rule rejects a copy of the
manifest broken in exactly that way, so no rule can decay into one that
always passes.  The validator runs as a subprocess with --manifest-dir, the
way CI runs it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from ._support import (
    all_entries,
    copy_manifest,
    edit_entry,
    edit_file,
    find_entry,
    lib,
    run_validator,
)

FOUR = "aliased, not_applicable, deferred or by_design"


def rejects(manifest_dir: Path, *needles: str) -> str:
    """Run the validator, assert it fails and prints every needle."""
    run = run_validator(manifest_dir)
    assert run.returncode == 1, run.stdout + run.stderr
    for needle in needles:
        assert needle in run.stdout, f"{needle!r} not in:\n{run.stdout}"
    return run.stdout


def test_the_real_manifest_passes() -> None:
    run = run_validator(lib.MANIFEST_DIR)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout == ""


@pytest.fixture
def m(tmp_path: Path) -> Path:
    return copy_manifest(tmp_path)


def pick(m: Path, pred: Callable[[dict], bool]) -> tuple[str, dict]:
    return find_entry(m, pred)


def rename_key(entry: dict, old: str, new: str) -> dict:
    return {(new if k == old else k): v for k, v in entry.items()}


def test_misspelled_policy_key(m: Path) -> None:
    file, e = pick(m, lambda e: e["state"] == "deferred")
    edit_entry(m, file, e["id"], lambda x: rename_key(x, "divergence", "divergance"))
    rejects(m, f"{e['id']}: unknown key 'divergance'", f"{e['id']}: missing key 'divergence'")


def test_divergence_misfiled_inside_the_claim(m: Path) -> None:
    file, e = pick(m, lambda e: e["mlxcel"] is not None and e["divergence"])
    edit_entry(m, file, e["id"], lambda x: x["mlxcel"].update(divergence=x["divergence"]))
    rejects(m, f"{e['id']}: unknown mlxcel claim key 'divergence'")


def test_unknown_claim_key(m: Path) -> None:
    file, e = pick(m, lambda e: e["kind"] == "option" and e["mlxcel"] is not None)
    edit_entry(m, file, e["id"], lambda x: x["mlxcel"].update(acepted_spellings=[]))
    rejects(m, "unknown mlxcel claim key 'acepted_spellings'")


def test_supported_with_a_divergence_names_the_honest_alternatives(m: Path) -> None:
    file, e = pick(m, lambda e: e["state"] == "supported")
    edit_entry(m, file, e["id"], lambda x: x.update(divergence=["answers differently"]))
    out = rejects(m, f"{e['id']}: state 'supported' with a non-empty divergence list")
    line = next(ln for ln in out.splitlines() if e["id"] in ln and "supported" in ln)
    assert FOUR in line and "owning issue" in line


def test_by_design_without_rationale(m: Path) -> None:
    file, e = pick(m, lambda e: e["state"] == "by_design")
    edit_entry(m, file, e["id"], lambda x: x.update(rationale=None))
    rejects(m, f"{e['id']}: by_design needs a rationale object")


def test_by_design_without_divergence_notes_or_test(m: Path) -> None:
    file, e = pick(m, lambda e: e["state"] == "by_design")
    edit_entry(m, file, e["id"], lambda x: x.update(divergence=[], notes="", test=None))
    rejects(m, "by_design needs a non-empty divergence list",
            "a by_design entry needs notes", "by_design needs a test pointer")


def test_rationale_on_a_deferred_entry(m: Path) -> None:
    file, e = pick(m, lambda e: e["state"] == "deferred")
    edit_entry(m, file, e["id"], lambda x: x.update(rationale={
        "kind": "policy", "reason": "because", "revisit_if": "never"}))
    rejects(m, f"{e['id']}: rationale must be null unless the state is by_design")


def test_architectural_with_revisit_if(m: Path) -> None:
    file, e = pick(m, lambda e: e["state"] == "by_design"
                   and e["rationale"]["kind"] == "architectural")
    edit_entry(m, file, e["id"], lambda x: x["rationale"].update(revisit_if="someday"))
    rejects(m, f"{e['id']}: rationale.revisit_if must be null when kind is architectural")


def test_policy_without_revisit_if(m: Path) -> None:
    file, e = pick(m, lambda e: e["state"] == "by_design" and e["rationale"]["kind"] == "policy")
    edit_entry(m, file, e["id"], lambda x: x["rationale"].update(revisit_if=None))
    rejects(m, f"{e['id']}: rationale.revisit_if must be a non-empty string when kind is policy")


def test_rationale_kind_outside_the_vocabulary(m: Path) -> None:
    file, e = pick(m, lambda e: e["state"] == "by_design")
    edit_entry(m, file, e["id"], lambda x: x["rationale"].update(kind="preference"))
    rejects(m, "rationale.kind must be 'architectural' or 'policy'")


def test_issue_outside_the_shard_owners(m: Path) -> None:
    file, e = pick(m, lambda e: e["state"] == "deferred")
    owners = lib.read(m / lib.PIN)["shards"][file.removesuffix(".json")]["owners"]
    stranger = max(owners) + 100
    edit_entry(m, file, e["id"], lambda x: x.update(issue=stranger))
    rejects(m, f"{e['id']}: issue #{stranger} does not own shard")


def test_deferred_without_an_issue(m: Path) -> None:
    file, e = pick(m, lambda e: e["state"] == "deferred")
    edit_entry(m, file, e["id"], lambda x: x.update(issue=None))
    rejects(m, f"{e['id']}: a deferred entry must name the issue that owns it")


@pytest.mark.parametrize(("pointer", "needle"), [
    ("tests/compat/test_no_such_file.py::test_x", "names a file that does not exist"),
    ("tests/compat/test_manifest_validator.py::test_no_such_test", "names no test"),
    ("tests/compat/test_manifest_validator.py::rejects", "names no test"),
    ("not a node id", "is not a pytest node id"),
])
def test_unresolvable_test_pointer(m: Path, pointer: str, needle: str) -> None:
    file, e = pick(m, lambda e: e["test"] is not None)
    edit_entry(m, file, e["id"], lambda x: x.update(test=pointer))
    rejects(m, f"{e['id']}: test pointer {pointer!r} {needle}")


def test_parametrized_and_class_pointers_resolve(m: Path) -> None:
    file, e = pick(m, lambda e: e["test"] is not None)
    pointer = "tests/compat/test_manifest_validator.py::test_unresolvable_test_pointer[x-y]"
    edit_entry(m, file, e["id"], lambda x: x.update(test=pointer))
    assert run_validator(m).returncode == 0


def test_unresolvable_env_test(m: Path) -> None:
    file, e = pick(m, lambda e: (e["mlxcel"] or {}).get("env_binding") == "runtime")
    edit_entry(m, file, e["id"], lambda x: x["mlxcel"].update(env_test="tests/x.py::test_y"))
    rejects(m, f"{e['id']}: mlxcel.env_test 'tests/x.py::test_y' names a file that does not exist")


def test_runtime_binding_needs_an_env_test(m: Path) -> None:
    file, e = pick(m, lambda e: (e["mlxcel"] or {}).get("env_binding") == "runtime")
    edit_entry(m, file, e["id"], lambda x: x["mlxcel"].pop("env_test"))
    rejects(m, f"{e['id']}: env_binding 'runtime' needs an env_test")


def test_state_outside_the_vocabulary(m: Path) -> None:
    file, e = pick(m, lambda e: e["state"] == "deferred")
    edit_entry(m, file, e["id"], lambda x: x.update(state="partial"))
    rejects(m, f"{e['id']}: state must be one of")


def test_policy_keys_out_of_order(m: Path) -> None:
    file, e = pick(m, lambda e: e["state"] == "deferred")

    def swap(x: dict) -> dict:
        keys = list(x)
        i, j = keys.index("notes"), keys.index("test")
        keys[i], keys[j] = keys[j], keys[i]
        return {k: x[k] for k in keys}
    edit_entry(m, file, e["id"], swap)
    rejects(m, f"{e['id']}: keys out of canonical order")


def test_aliased_claim_naming_the_upstream_identity(m: Path) -> None:
    file, e = pick(m, lambda e: e["kind"] == "route" and e["mlxcel"] is not None)
    edit_entry(m, file, e["id"], lambda x: x.update(state="aliased", divergence=[], issue=2))
    rejects(m, f"{e['id']}: aliased, but the claim names upstream's own identity")


def test_supported_entry_without_a_claim(m: Path) -> None:
    file, e = pick(m, lambda e: e["state"] == "supported")
    edit_entry(m, file, e["id"], lambda x: x.update(mlxcel=None))
    rejects(m, f"{e['id']}: state 'supported' needs an mlxcel claim block")


def test_non_canonical_formatting(m: Path) -> None:
    file, _ = all_entries(m)[0]
    path = m / file
    path.write_text(json.dumps(lib.read(path), indent=4) + "\n", encoding="utf-8")
    rejects(m, f"{file}: not in canonical form")


def test_entries_not_sorted_by_id(m: Path) -> None:
    file = next(f for f, _ in all_entries(m)
                if len(lib.read(m / f)["entries"]) > 2)
    edit_file(m / file, lambda doc: doc["entries"].reverse())
    rejects(m, f"{file}: entries are not sorted by id")


def test_count_off_by_one(m: Path) -> None:
    want = lib.read(m / lib.PIN)["inventory"]["options"]
    edit_file(m / lib.PIN, lambda pin: pin["inventory"].update(options=want + 1))
    rejects(m, f"inventory.options is {want + 1} but the shards hold {want}")


def test_unclassified_entry(m: Path) -> None:
    file, e = pick(m, lambda e: e["kind"] == "route")
    edit_file(m / file, lambda doc: doc.update(
        entries=[x for x in doc["entries"] if x["id"] != e["id"]]))
    skeleton = lib.assemble(lib.split(e)[0], lib.skeleton_policy())
    edit_file(m / lib.UNCLASSIFIED, lambda doc: doc["entries"].append(skeleton))
    rejects(m, f"{lib.UNCLASSIFIED}: {e['id']}: new upstream item not classified yet")


def test_shard_without_owners(m: Path) -> None:
    edit_file(m / lib.PIN, lambda pin: pin["shards"]["speculative"].update(owners=[]))
    rejects(m, "shards['speculative'].owners is empty")


def test_duplicate_id_across_shards(m: Path) -> None:
    file, e = pick(m, lambda e: e["kind"] == "option")
    other = next(f for f, _ in all_entries(m) if f != file)
    edit_file(m / other, lambda doc: doc.update(
        entries=sorted(doc["entries"] + [e], key=lambda x: x["id"])))
    rejects(m, f"{e['id']}: duplicate id")


def test_schema_version(m: Path) -> None:
    edit_file(m / lib.PIN, lambda pin: pin.update(schema_version=3))
    rejects(m, "pin.json: schema_version must be 4")


# -- mlxcel-only routes (the extensions file) ---------------------------------------------

EXT = "GET /v1/responses/:response_id"


def edit_extension(m: Path, fn: Callable[[dict], Any]) -> None:
    edit_entry(m, lib.EXTENSIONS, EXT, fn)


def test_extensions_file_must_be_listed_in_pin(m: Path) -> None:
    edit_file(m / lib.PIN, lambda pin: pin.pop("extensions"))
    rejects(m, f"{lib.EXTENSIONS}: is not a shard listed in pin.json")


def test_extension_entry_of_an_upstream_kind(m: Path) -> None:
    edit_extension(m, lambda e: e.update(kind="route"))
    rejects(m, f"{lib.EXTENSIONS}: {EXT}: the extensions file holds only 'mlxcel_route' entries")


def test_extension_without_a_test(m: Path) -> None:
    edit_extension(m, lambda e: e.update(test=None))
    rejects(m, f"{lib.EXTENSIONS}: {EXT}: an mlxcel-only route needs a test pointer")


def test_extension_claiming_another_route(m: Path) -> None:
    edit_extension(m, lambda e: e["mlxcel"]["route"].update(path="/v1/responses"))
    rejects(m, f"{lib.EXTENSIONS}: {EXT}: an mlxcel-only route claims exactly its own "
            "mounted route")


def test_extension_id_not_its_method_and_path(m: Path) -> None:
    edit_extension(m, lambda e: e.update(path="/v1/responses/:id"))
    rejects(m, 'id must be "<method> <path>" of the entry\'s own method and path')


def test_extension_supported_with_a_divergence(m: Path) -> None:
    edit_extension(m, lambda e: e.update(state="supported", rationale=None))
    rejects(m, f"{lib.EXTENSIONS}: {EXT}: state 'supported' with a non-empty divergence list")


def test_extension_outside_its_states(m: Path) -> None:
    edit_extension(m, lambda e: e.update(state="not_applicable", rationale=None))
    rejects(m, "an mlxcel-only route is one of supported, deferred, by_design")


def test_extension_issue_outside_its_owners(m: Path) -> None:
    edit_extension(m, lambda e: e.update(issue=3))
    rejects(m, "issue must be one of the extensions' owners (#4, #6), got 3")


def test_extension_shadowing_an_upstream_route(m: Path) -> None:
    def shadow(e: dict) -> dict:
        e.update(id="POST /completion", method="POST", path="/completion")
        e["mlxcel"]["route"].update(method="POST", path="/completion")
        return e
    edit_extension(m, shadow)
    edit_file(m / lib.EXTENSIONS, lambda d: d["entries"].sort(key=lambda e: e["id"]))
    rejects(m, f"{lib.EXTENSIONS}: POST /completion: duplicate id (also in routes.json)")

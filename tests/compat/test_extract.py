"""The extractor: deterministic, policy-preserving, and it files new
upstream items under _unclassified.json (which the validator refuses)."""

from __future__ import annotations

import filecmp
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ._support import (
    EXTRACTOR,
    MANIFEST,
    copy_manifest,
    edit_entry,
    find_entry,
    lib,
    needs_shared,
    run_validator,
)

pytestmark = needs_shared


def extract(manifest_dir: Path, shared: Path = lib.SHARED_DIR) -> subprocess.CompletedProcess:
    run = subprocess.run([sys.executable, str(EXTRACTOR), "--shared", str(shared),
                          "--manifest-dir", str(manifest_dir)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    return run


def same_tree(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    if names != sorted(p.name for p in b.iterdir()):
        return False
    match, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    return not mismatch and not errors


def test_extracting_the_committed_manifest_changes_nothing(tmp_path: Path) -> None:
    m = copy_manifest(tmp_path)
    assert extract(m).stdout.strip() == "manifest unchanged"
    assert same_tree(m, MANIFEST)


def test_running_twice_is_byte_identical(tmp_path: Path) -> None:
    m = copy_manifest(tmp_path)
    # disturb the facts and the formatting; the first run repairs both
    file, e = find_entry(m, lambda e: e["kind"] == "option")
    edit_entry(m, file, e["id"], lambda x: x.update(default="tampered", section="nowhere"))
    (m / file).write_text(json.dumps(lib.read(m / file), indent=4), encoding="utf-8")
    extract(m)
    first = {p.name: p.read_bytes() for p in m.iterdir()}
    extract(m)
    assert {p.name: p.read_bytes() for p in m.iterdir()} == first
    assert same_tree(m, MANIFEST)


def test_policy_is_kept_by_id_and_facts_are_rewritten(tmp_path: Path) -> None:
    m = copy_manifest(tmp_path)
    file, e = find_entry(m, lambda e: e["kind"] == "route")
    edit_entry(m, file, e["id"], lambda x: x.update(notes="a human wrote this",
                                                    api_key_exempt=not x["api_key_exempt"]))
    extract(m)
    (after,) = [x for x in lib.read(m / file)["entries"] if x["id"] == e["id"]]
    assert after["notes"] == "a human wrote this"
    assert after["api_key_exempt"] == e["api_key_exempt"]
    assert list(after) == list(lib.FACT_KEYS["route"]) + list(lib.POLICY_KEYS)


def fake_shared(tmp_path: Path) -> Path:
    shared = tmp_path / "shared"
    shutil.copytree(lib.upstream_dir(lib.SHARED_DIR), lib.upstream_dir(shared))
    for path in lib.upstream_dir(shared).iterdir():
        path.chmod(0o644)
    return shared


def test_a_new_upstream_item_lands_in_unclassified(tmp_path: Path) -> None:
    shared = fake_shared(tmp_path)
    options = lib.upstream_dir(shared) / "options.json"
    data = json.loads(options.read_text())
    data["options"].append({
        "spellings": ["--brand-new"], "short": [], "long": ["--brand-new"],
        "value_hint": "N", "env": ["LLAMA_ARG_BRAND_NEW"], "default": "0",
        "description": "x", "help_text": "x", "section": "example-specific params"})
    options.write_text(json.dumps(data))
    m = copy_manifest(tmp_path)
    run = extract(m, shared)
    assert "new upstream item --brand-new" in run.stderr
    pending = lib.read(m / lib.UNCLASSIFIED)["entries"]
    assert [p["id"] for p in pending] == ["--brand-new"]
    assert pending[0]["state"] is None and pending[0]["mlxcel"] is None
    assert lib.read(m / lib.PIN)["inventory"]["options"] == 250
    v = run_validator(m, "--shared", str(shared))
    assert v.returncode == 1
    assert "_unclassified.json: --brand-new: new upstream item not classified yet" in v.stdout
    # a second run keeps it there, unchanged
    before = (m / lib.UNCLASSIFIED).read_bytes()
    extract(m, shared)
    assert (m / lib.UNCLASSIFIED).read_bytes() == before


def test_an_item_gone_upstream_is_dropped(tmp_path: Path) -> None:
    shared = fake_shared(tmp_path)
    routes = lib.upstream_dir(shared) / "routes.json"
    data = json.loads(routes.read_text())
    data["routes"] = [r for r in data["routes"] if r["path"] != "/infill"]
    routes.write_text(json.dumps(data))
    m = copy_manifest(tmp_path)
    run = extract(m, shared)
    assert "dropped POST /infill" in run.stderr
    assert all(e["id"] != "POST /infill" for f in m.glob("*.json")
               for e in lib.read(f).get("entries", []))
    assert run_validator(m, "--shared", str(shared)).returncode == 0


def test_owner_sets_survive_and_a_new_shard_starts_empty(tmp_path: Path) -> None:
    m = copy_manifest(tmp_path)
    owners = {k: v["owners"] for k, v in lib.read(m / lib.PIN)["shards"].items()}
    lib.write(m / "brand-new-area.json", lib.shard_document("brand-new-area", []))
    extract(m)
    shards = lib.read(m / lib.PIN)["shards"]
    assert {k: v["owners"] for k, v in shards.items() if k != "brand-new-area"} == owners
    assert shards["brand-new-area"] == {"file": "brand-new-area.json", "owners": []}
    assert "shards['brand-new-area'].owners is empty" in run_validator(m).stdout


def test_missing_reference_data_is_one_line(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(EXTRACTOR), "--shared", str(tmp_path / "none"),
                          "--manifest-dir", str(tmp_path / "m")], capture_output=True, text=True)
    assert run.returncode != 0 and "no upstream reference data" in run.stderr


@pytest.mark.parametrize("kind", lib.KINDS)
def test_fact_records_have_their_kinds_keys(kind: str) -> None:
    for fact in lib.upstream_facts(lib.SHARED_DIR):
        if fact["kind"] == kind:
            assert tuple(fact) == lib.FACT_KEYS[kind]

#!/usr/bin/env python3
"""Regenerate the fact half of the llama-server compatibility manifest.

    python scripts/compat/extract_manifest.py [--shared DIR] [--manifest-dir DIR]

Reads the upstream reference data (``<shared>/upstream/llama-server``:
options.json, routes.json, native_completion_fields.json, version.txt) and
rewrites, deterministically:

* every entry's fact keys (kind, id and the kind's facts), wholesale;
* pin.json's release block and inventory counts.

What a human decided is preserved: an entry's policy keys (state, issue,
test, notes, divergence, rationale, mlxcel) are kept by entry id and
re-emitted in canonical order, and each entry stays in the shard it was
filed in; pin.json's shard owner map is kept by shard name (a shard file
that is new gets an empty owner set, which the validator refuses until
someone assigns owners).  An upstream item with no entry yet lands in
_unclassified.json with an empty policy, which the validator refuses until
it is classified; an entry whose item vanished upstream is dropped and
reported on stderr.  Running it twice leaves the tree byte-identical.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import manifest_lib as lib  # noqa: E402


def _existing(manifest_dir: Path, shard_names: list[str]) -> dict[str, tuple[str, dict]]:
    """id -> (shard name, or "" for _unclassified, policy half)."""
    found: dict[str, tuple[str, dict]] = {}
    sources = [(name, manifest_dir / lib.shard_file(name)) for name in shard_names]
    sources.append(("", manifest_dir / lib.UNCLASSIFIED))
    for name, path in sources:
        if not path.exists():
            continue
        for entry in lib.read(path).get("entries", []):
            _, policy = lib.split(entry)
            if entry["id"] in found:
                raise SystemExit(f"error: {entry['id']} appears in two files "
                                 f"({found[entry['id']][0] or lib.UNCLASSIFIED}, {path.name})")
            found[entry["id"]] = (name, policy)
    return found


def extract(shared: Path, manifest_dir: Path) -> list[str]:
    """Rewrite the manifest in place; returns the names of files that changed."""
    if not lib.have_upstream(shared):
        raise SystemExit(f"error: no upstream reference data under {lib.upstream_dir(shared)}")
    manifest_dir.mkdir(parents=True, exist_ok=True)
    pin_path = manifest_dir / lib.PIN
    pin = lib.read(pin_path) if pin_path.exists() else {}
    shards = dict(pin.get("shards") or {})
    names = list(shards) or list(lib.SHARD_NAMES)
    for name in names:
        shards.setdefault(name, {"file": lib.shard_file(name), "owners": []})
    for path in sorted(manifest_dir.glob("*.json")):
        stem = path.stem
        if path.name not in (lib.PIN, lib.UNCLASSIFIED, lib.EXTENSIONS) and stem not in shards:
            names.append(stem)
            shards[stem] = {"file": path.name, "owners": []}
    facts = lib.upstream_facts(shared)
    existing = _existing(manifest_dir, names)

    by_shard: dict[str, list[dict]] = {name: [] for name in names}
    pending: list[dict] = []
    for fact in facts:
        shard, policy = existing.get(fact["id"], ("", lib.skeleton_policy()))
        entry = lib.assemble(fact, policy)
        (by_shard[shard] if shard else pending).append(entry)
    gone = sorted(set(existing) - {f["id"] for f in facts})
    for eid in gone:
        print(f"dropped {eid}: no longer in the upstream inventory", file=sys.stderr)
    for entry in pending:
        if entry["id"] not in existing:
            print(f"new upstream item {entry['id']} -> {lib.UNCLASSIFIED}", file=sys.stderr)

    new_pin = {
        "schema_version": lib.SCHEMA_VERSION,
        "release": lib.upstream_release(shared),
        "inventory": lib.inventory_of(facts),
        "shards": {name: {"file": shards[name].get("file", lib.shard_file(name)),
                          "owners": list(shards[name].get("owners", []))} for name in names},
    }
    if "extensions" in pin:  # mlxcel-only routes: ours, kept as they are
        new_pin["extensions"] = pin["extensions"]
    changed = []
    if lib.write(pin_path, new_pin):
        changed.append(lib.PIN)
    for name in names:
        if lib.write(manifest_dir / lib.shard_file(name),
                     lib.shard_document(name, by_shard[name])):
            changed.append(lib.shard_file(name))
    if lib.write(manifest_dir / lib.UNCLASSIFIED, lib.unclassified_document(pending)):
        changed.append(lib.UNCLASSIFIED)
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", type=Path, default=lib.SHARED_DIR,
                    help="the shared reference data root (default: ../shared)")
    ap.add_argument("--manifest-dir", type=Path, default=lib.MANIFEST_DIR)
    args = ap.parse_args(argv)
    changed = extract(args.shared, args.manifest_dir)
    for name in changed:
        print(f"wrote {name}")
    if not changed:
        print("manifest unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())

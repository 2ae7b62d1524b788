#!/usr/bin/env python3
"""Offline structural validation of the llama-server compatibility manifest.

    python scripts/ci/check_llama_compat_manifest.py [--manifest-dir DIR]
                                                     [--shared DIR] [--repo-root DIR]

Checks, without running anything: pin.json and every shard file exist and
carry schema_version 4; inventory counts match pin.json and, when the shared
upstream reference data is present, the upstream inventory itself (the same
ids, not only the same numbers); every entry has exactly its kind's fact keys
followed by the seven policy keys in canonical order; states, issue links and
shard ownership; the divergence rule; by_design obligations; rationale rules;
the closed claim-key set; test pointers resolve to real pytest items (parsed
with ast); _unclassified.json is empty; every file is in canonical form.
mlxcel-only routes live in the extensions file pin.json lists under
"extensions" (kind mlxcel_route): each names the contract it follows, claims
exactly its own mounted route, has a test, and never shadows an upstream id.

Exit status 0 when the manifest is valid, 1 otherwise, with one line per
problem on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compat"))

import manifest_lib as lib  # noqa: E402

SUPPORTED_WITH_DIVERGENCE = (
    "state 'supported' with a non-empty divergence list: an entry that differs "
    "observably from upstream cannot be supported; reclassify it as one of "
    + ", ".join(lib.HONEST_ALTERNATIVES[:-1]) + " or " + lib.HONEST_ALTERNATIVES[-1]
    + " and name the owning issue"
)


class Problems:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, where: str, what: str) -> None:
        self.lines.append(f"{where}: {what}")


def _is_str_list(value: Any, allow_empty: bool = True) -> bool:
    return (isinstance(value, list) and all(isinstance(v, str) and v for v in value)
            and (allow_empty or bool(value)))


def _nonempty_str(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def check_canonical(path: Path, doc: Any, p: Problems) -> None:
    text = path.read_text(encoding="utf-8")
    if text != lib.canonical(doc):
        p.add(path.name, "not in canonical form (json.dumps(indent=2, sort_keys=False, "
              "ensure_ascii=False) plus a trailing newline); run scripts/compat/extract_manifest.py")


def check_pin(pin: Any, p: Problems) -> dict[str, list[int]]:
    """The shard owner map, or {} when pin.json is unusable."""
    where = lib.PIN
    if not isinstance(pin, dict):
        p.add(where, "is not a JSON object")
        return {}
    if pin.get("schema_version") != lib.SCHEMA_VERSION:
        p.add(where, f"schema_version must be {lib.SCHEMA_VERSION}")
    release = pin.get("release")
    if not isinstance(release, dict):
        p.add(where, "release must be an object")
    else:
        for key in ("name", "git_describe", "commit", "commit_date", "obtained"):
            if not _nonempty_str(release.get(key)):
                p.add(where, f"release.{key} must be a non-empty string")
    inv = pin.get("inventory")
    if not isinstance(inv, dict) or not all(isinstance(v, int) for v in inv.values()):
        p.add(where, "inventory must be an object of integer counts")
    shards = pin.get("shards")
    owners: dict[str, list[int]] = {}
    if not isinstance(shards, dict) or not shards:
        p.add(where, "shards must be a non-empty object")
        return {}
    for name, spec in shards.items():
        if not isinstance(spec, dict) or set(spec) != {"file", "owners"}:
            p.add(where, f"shards[{name!r}] must be an object with exactly file and owners")
            continue
        if spec["file"] != lib.shard_file(name):
            p.add(where, f"shards[{name!r}].file must be {lib.shard_file(name)!r}")
        own = spec["owners"]
        if (not isinstance(own, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                 for i in own)):
            p.add(where, f"shards[{name!r}].owners must be a list of issue numbers")
            continue
        if not own:
            p.add(where, f"shards[{name!r}].owners is empty: a human must assign the owning "
                  "issues before entries can live there")
        owners[name] = own
    return owners


def check_pin_extensions(pin: dict, p: Problems) -> list[int] | None:
    """The extensions file's owners, or None when pin.json lists none."""
    if not isinstance(pin, dict) or "extensions" not in pin:
        return None
    spec = pin["extensions"]
    if not isinstance(spec, dict) or set(spec) != {"file", "owners"} \
            or spec.get("file") != lib.EXTENSIONS:
        p.add(lib.PIN, f"extensions must be {{\"file\": {lib.EXTENSIONS!r}, \"owners\": [...]}}")
        return []
    own = spec["owners"]
    if not isinstance(own, list) or not own or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in own):
        p.add(lib.PIN, "extensions.owners must be a non-empty list of issue numbers")
        return []
    return own


def check_extension_entry(where: str, entry: Any, owners: list[int], repo: Path,
                          p: Problems) -> None:
    """One mlxcel-only route: its facts are ours, so they must describe it."""
    if not isinstance(entry, dict):
        p.add(where, "entry is not an object")
        return
    if entry.get("kind") != lib.EXTENSION_KIND:
        p.add(where, f"the extensions file holds only {lib.EXTENSION_KIND!r} entries "
              f"(got kind {entry.get('kind')!r})")
        return
    expected = list(lib.EXTENSION_FACT_KEYS) + list(lib.POLICY_KEYS)
    if list(entry) != expected:
        p.add(where, f"an {lib.EXTENSION_KIND} entry carries exactly {', '.join(expected)}, "
              "in that order")
        return
    method, path = entry["method"], entry["path"]
    if not (_nonempty_str(method) and _nonempty_str(path)) or entry["id"] != f"{method} {path}":
        p.add(where, "id must be \"<method> <path>\" of the entry's own method and path")
    if not isinstance(entry["api_key_exempt"], bool):
        p.add(where, "api_key_exempt must be true or false")
    if not _nonempty_str(entry["reference"]):
        p.add(where, "reference must name the API whose contract the route follows")
    state = entry["state"]
    if state not in lib.EXTENSION_STATES:
        p.add(where, f"an mlxcel-only route is one of {', '.join(lib.EXTENSION_STATES)} "
              f"(got {state!r})")
    issue = entry["issue"]
    if not isinstance(issue, int) or isinstance(issue, bool) or issue not in owners:
        p.add(where, f"issue must be one of the extensions' owners "
              f"({', '.join('#' + str(i) for i in owners)}), got {issue!r}")
    test = entry["test"]
    if test is None:
        p.add(where, "an mlxcel-only route needs a test pointer")
    else:
        why = lib.resolve_test(test, repo) if isinstance(test, str) else "is not a string"
        if why:
            p.add(where, f"test pointer {test!r} {why}")
    if not _nonempty_str(entry["notes"]):
        p.add(where, "an mlxcel-only route needs notes saying what it serves and why")
    div = entry["divergence"]
    if not _is_str_list(div):
        p.add(where, "divergence must be a list of non-empty strings")
        div = []
    if state == "supported" and div:
        p.add(where, "state 'supported' with a non-empty divergence list: an mlxcel-only route "
              "that differs from its reference contract is by_design or deferred")
    if state == "by_design" and not div:
        p.add(where, "by_design needs a non-empty divergence list (an entry with none is "
              "supported)")
    check_rationale(where, entry, p)
    claim = entry["mlxcel"]
    want = {"route": {"method": method, "path": path}}
    if state != "deferred" and claim != want:
        p.add(where, f"an mlxcel-only route claims exactly its own mounted route: {want}")
    elif state == "deferred" and claim is not None and claim != want:
        p.add(where, f"the claim must be null or {want}")


def check_extensions(manifest_dir: Path, owners: list[int], seen: dict[str, str], repo: Path,
                     p: Problems) -> list[dict]:
    path = manifest_dir / lib.EXTENSIONS
    doc = load_json(path, p)
    if doc is None:
        return []
    check_canonical(path, doc, p)
    if not isinstance(doc, dict) or list(doc) != ["schema_version", "shard", "entries"] \
            or not isinstance(doc["entries"], list):
        p.add(path.name, "must be an object with exactly schema_version, shard, entries")
        return []
    if doc["schema_version"] != lib.SCHEMA_VERSION:
        p.add(path.name, f"schema_version must be {lib.SCHEMA_VERSION}")
    if doc["shard"] != lib.EXTENSIONS_SHARD:
        p.add(path.name, f"shard must be {lib.EXTENSIONS_SHARD!r}")
    items = doc["entries"]
    ids = [e.get("id") for e in items if isinstance(e, dict)]
    if ids != sorted(ids, key=str):
        p.add(path.name, "entries are not sorted by id")
    out = []
    for entry in items:
        eid = entry.get("id") if isinstance(entry, dict) else None
        where = f"{path.name}: {eid}"
        if eid in seen:
            p.add(where, f"duplicate id (also in {seen[eid]}): an mlxcel-only route may not "
                  "shadow an upstream entry")
        seen[str(eid)] = path.name
        check_extension_entry(where, entry, owners, repo, p)
        if isinstance(entry, dict):
            out.append(entry)
    return out


def check_rationale(where: str, entry: dict, p: Problems) -> None:
    state, rat = entry.get("state"), entry.get("rationale")
    if state != "by_design":
        if rat is not None:
            p.add(where, f"rationale must be null unless the state is by_design (state is {state!r})")
        return
    if not isinstance(rat, dict):
        p.add(where, "by_design needs a rationale object {kind, reason, revisit_if}")
        return
    if list(rat) != list(lib.RATIONALE_KEYS):
        p.add(where, f"rationale keys must be exactly {list(lib.RATIONALE_KEYS)} in that order "
              f"(got {list(rat)})")
    kind = rat.get("kind")
    if kind not in lib.RATIONALE_KINDS:
        p.add(where, f"rationale.kind must be 'architectural' or 'policy' (got {kind!r})")
    if not _nonempty_str(rat.get("reason")):
        p.add(where, "rationale.reason must be a non-empty string saying why the divergence "
              "is permanent")
    revisit = rat.get("revisit_if")
    if kind == "architectural" and revisit is not None:
        p.add(where, "rationale.revisit_if must be null when kind is architectural")
    if kind == "policy" and not _nonempty_str(revisit):
        p.add(where, "rationale.revisit_if must be a non-empty string when kind is policy")


def check_claim(where: str, entry: dict, repo: Path, p: Problems) -> None:
    claim = entry.get("mlxcel")
    if claim is None:
        if entry.get("state") in ("supported", "aliased", "by_design"):
            p.add(where, f"state {entry['state']!r} needs an mlxcel claim block naming what "
                  "the binaries accept")
        return
    if not isinstance(claim, dict):
        p.add(where, "mlxcel must be null or an object")
        return
    unknown = [k for k in claim if k not in lib.CLAIM_KEYS]
    for key in unknown:
        p.add(where, f"unknown mlxcel claim key {key!r} (allowed: {', '.join(lib.CLAIM_KEYS)})")
    order = [k for k in lib.CLAIM_KEYS if k in claim]
    if not unknown and list(claim) != order:
        p.add(where, f"mlxcel claim keys out of canonical order (expected {order})")
    if not claim:
        p.add(where, "mlxcel claim block is empty; use null for no claim")
    kind = entry.get("kind")
    option_keys = ("accepted_spellings", "accepted_on_one_binary_only", "env", "env_binding",
                   "env_test", "hidden")
    for key in option_keys:
        if key in claim and kind != "option":
            p.add(where, f"mlxcel.{key} only applies to option entries")
    if "route" in claim and kind != "route":
        p.add(where, "mlxcel.route only applies to route entries")
    if "field" in claim and kind != "native_request_field":
        p.add(where, "mlxcel.field only applies to native_request_field entries")
    if kind == "option" and "accepted_spellings" not in claim:
        p.add(where, "an option claim must list accepted_spellings")
    if kind == "route" and "route" not in claim:
        p.add(where, "a route claim must name the mounted route")
    if kind == "native_request_field" and "field" not in claim:
        p.add(where, "a native field claim must name the field")
    if "accepted_spellings" in claim and not _is_str_list(claim["accepted_spellings"], False):
        p.add(where, "mlxcel.accepted_spellings must be a non-empty list of strings")
    one = claim.get("accepted_on_one_binary_only")
    if "accepted_on_one_binary_only" in claim and one not in lib.BINARIES:
        p.add(where, f"mlxcel.accepted_on_one_binary_only must be one of {list(lib.BINARIES)}")
    if "env" in claim:
        if not _is_str_list(claim["env"], False):
            p.add(where, "mlxcel.env must be a non-empty list of variable names")
        if claim.get("env_binding") not in lib.ENV_BINDINGS:
            p.add(where, "mlxcel.env needs env_binding 'argparse' or 'runtime'")
    elif "env_binding" in claim or "env_test" in claim:
        p.add(where, "mlxcel.env_binding/env_test without mlxcel.env")
    if claim.get("env_binding") == "runtime" and not claim.get("env_test"):
        p.add(where, "env_binding 'runtime' needs an env_test pointer to the test of the bridge")
    if "env_test" in claim:
        test = claim["env_test"]
        why = lib.resolve_test(test, repo) if isinstance(test, str) else "is not a string"
        if why:
            p.add(where, f"mlxcel.env_test {test!r} {why}")
    if "defaults" in claim and not isinstance(claim["defaults"], dict):
        p.add(where, "mlxcel.defaults must be an object")
    if "hidden" in claim and not isinstance(claim["hidden"], bool):
        p.add(where, "mlxcel.hidden must be true or false")
    route = claim.get("route")
    if "route" in claim and not (isinstance(route, dict) and list(route) == ["method", "path"]
                                 and all(_nonempty_str(v) for v in route.values())):
        p.add(where, "mlxcel.route must be {\"method\": ..., \"path\": ...}")
    field = claim.get("field")
    if "field" in claim and not (isinstance(field, dict) and list(field) == ["name", "aliases"]
                                 and _nonempty_str(field["name"])
                                 and _is_str_list(field["aliases"])):
        p.add(where, "mlxcel.field must be {\"name\": ..., \"aliases\": [...]}")
    if entry.get("state") == "aliased":
        check_alias_identity(where, entry, claim, p)


def check_alias_identity(where: str, entry: dict, claim: dict, p: Problems) -> None:
    """An aliased claim names an mlxcel identity that differs from upstream's."""
    kind = entry.get("kind")
    same = False
    if kind == "option":
        ours = set(claim.get("accepted_spellings") or [])
        same = not (ours - set(entry.get("spellings") or []))
    elif kind == "route":
        route = claim.get("route") or {}
        same = (route.get("method"), route.get("path")) == (entry.get("method"), entry.get("path"))
    elif kind == "native_request_field":
        same = (claim.get("field") or {}).get("name") == entry.get("id")
    if same:
        p.add(where, "aliased, but the claim names upstream's own identity: an entry answered "
              "under the upstream name is supported (or by_design), not aliased")


def check_entry(where: str, entry: Any, shard: str, owners: list[int], repo: Path,
                p: Problems) -> None:
    if not isinstance(entry, dict):
        p.add(where, "entry is not an object")
        return
    kind = entry.get("kind")
    if kind not in lib.FACT_KEYS:
        p.add(where, f"unknown kind {kind!r} (one of {', '.join(lib.KINDS)})")
        return
    expected = list(lib.FACT_KEYS[kind]) + list(lib.POLICY_KEYS)
    keys = list(entry)
    for key in keys:
        if key not in expected:
            p.add(where, f"unknown key {key!r}: an {kind} entry carries exactly "
                  f"{', '.join(expected)}")
    for key in expected:
        if key not in entry:
            p.add(where, f"missing key {key!r}")
    if set(keys) == set(expected) and keys != expected:
        p.add(where, f"keys out of canonical order (facts, then {', '.join(lib.POLICY_KEYS)})")
    state = entry.get("state")
    if state not in lib.STATES:
        p.add(where, f"state must be one of {', '.join(lib.STATES)} (got {state!r})")
    issue = entry.get("issue")
    if issue is None:
        if state in lib.NEEDS_ISSUE:
            p.add(where, f"a {state} entry must name the issue that owns it")
    elif not isinstance(issue, int) or isinstance(issue, bool):
        p.add(where, f"issue must be an issue number or null (got {issue!r})")
    elif issue not in owners:
        p.add(where, f"issue #{issue} does not own shard {shard!r} (owners: "
              f"{', '.join('#' + str(i) for i in owners) or 'none'})")
    test = entry.get("test")
    if test is not None:
        why = lib.resolve_test(test, repo) if isinstance(test, str) else "is not a string"
        if why:
            p.add(where, f"test pointer {test!r} {why}")
    notes = entry.get("notes")
    if not isinstance(notes, str):
        p.add(where, "notes must be a string")
    elif state in lib.HONEST_ALTERNATIVES and not notes.strip():
        p.add(where, f"a {state} entry needs notes explaining the classification")
    div = entry.get("divergence")
    if not _is_str_list(div):
        p.add(where, "divergence must be a list of non-empty strings")
        div = []
    if state == "supported" and div:
        p.add(where, SUPPORTED_WITH_DIVERGENCE)
    if state == "by_design":
        if not div:
            p.add(where, "by_design needs a non-empty divergence list (an entry with none is "
                  "supported)")
        if test is None:
            p.add(where, "by_design needs a test pointer that pins the permanent behaviour")
    check_rationale(where, entry, p)
    check_claim(where, entry, repo, p)


def load_json(path: Path, p: Problems) -> Any:
    try:
        return lib.read(path)
    except FileNotFoundError:
        p.add(path.name, "missing")
    except json.JSONDecodeError as exc:
        p.add(path.name, f"is not valid JSON ({exc.msg} at line {exc.lineno})")
    return None


def validate(manifest_dir: Path, shared: Path | None, repo: Path) -> list[str]:
    p = Problems()
    pin = load_json(manifest_dir / lib.PIN, p)
    if pin is None:
        return p.lines
    check_canonical(manifest_dir / lib.PIN, pin, p)
    owners = check_pin(pin, p)
    ext_owners = check_pin_extensions(pin, p)

    listed = {lib.shard_file(n) for n in owners} | {lib.PIN, lib.UNCLASSIFIED}
    if ext_owners is not None:
        listed.add(lib.EXTENSIONS)
    for extra in sorted(manifest_dir.glob("*.json")):
        if extra.name not in listed:
            p.add(extra.name, "is not a shard listed in pin.json")

    entries: list[dict] = []
    seen: dict[str, str] = {}
    for name, own in owners.items():
        path = manifest_dir / lib.shard_file(name)
        doc = load_json(path, p)
        if doc is None:
            continue
        check_canonical(path, doc, p)
        if not isinstance(doc, dict) or list(doc) != ["schema_version", "shard", "entries"]:
            p.add(path.name, "must be an object with exactly schema_version, shard, entries")
            continue
        if doc["schema_version"] != lib.SCHEMA_VERSION:
            p.add(path.name, f"schema_version must be {lib.SCHEMA_VERSION}")
        if doc["shard"] != name:
            p.add(path.name, f"shard must be {name!r}")
        items = doc["entries"] if isinstance(doc["entries"], list) else []
        ids = [e.get("id") for e in items if isinstance(e, dict)]
        if ids != sorted(ids, key=str):
            p.add(path.name, "entries are not sorted by id")
        for entry in items:
            eid = entry.get("id") if isinstance(entry, dict) else None
            where = f"{path.name}: {eid}"
            if eid in seen:
                p.add(where, f"duplicate id (also in {seen[eid]})")
            seen[str(eid)] = path.name
            check_entry(where, entry, name, own, repo, p)
            if isinstance(entry, dict):
                entries.append(entry)

    unclassified = load_json(manifest_dir / lib.UNCLASSIFIED, p)
    if unclassified is not None:
        check_canonical(manifest_dir / lib.UNCLASSIFIED, unclassified, p)
        pending = unclassified.get("entries") if isinstance(unclassified, dict) else None
        if not isinstance(unclassified, dict) or unclassified.get("schema_version") != \
                lib.SCHEMA_VERSION or not isinstance(pending, list):
            p.add(lib.UNCLASSIFIED, f"must be {{schema_version: {lib.SCHEMA_VERSION}, entries: []}}")
        elif pending:
            for e in pending:
                p.add(lib.UNCLASSIFIED, f"{e.get('id')}: new upstream item not classified yet; "
                      "move it to its shard with a state, an owning issue and notes")

    extensions = check_extensions(manifest_dir, ext_owners, seen, repo, p) \
        if ext_owners is not None else []

    check_counts(pin, entries, p)
    if shared is not None and lib.have_upstream(shared):
        check_against_upstream(entries, shared, p)
        upstream_ids = {f["id"] for f in lib.upstream_facts(shared)}
        for e in extensions:
            if e.get("id") in upstream_ids:
                p.add(f"{lib.EXTENSIONS}: {e['id']}", "is in the upstream inventory: classify "
                      "it in its shard, not as an mlxcel-only route")
    return p.lines


def check_counts(pin: dict, entries: list[dict], p: Problems) -> None:
    inv = pin.get("inventory")
    if not isinstance(inv, dict):
        return
    try:
        have = lib.inventory_of(entries)
    except (KeyError, TypeError):
        p.add(lib.PIN, "inventory cannot be counted: some entries lack their fact keys")
        return
    for key, want in inv.items():
        if key not in have:
            p.add(lib.PIN, f"inventory.{key} is not a count this validator knows")
        elif have[key] != want:
            p.add(lib.PIN, f"inventory.{key} is {want} but the shards hold {have[key]}")
    for key in have:
        if key not in inv:
            p.add(lib.PIN, f"inventory.{key} missing")


def check_against_upstream(entries: list[dict], shared: Path, p: Problems) -> None:
    facts = lib.upstream_facts(shared)
    theirs = {f["id"]: f for f in facts}
    ours = {e["id"]: e for e in entries if "id" in e}
    for eid in sorted(set(theirs) - set(ours)):
        p.add("upstream", f"{eid}: in the upstream inventory but in no shard (run "
              "scripts/compat/extract_manifest.py; it lands in _unclassified.json)")
    for eid in sorted(set(ours) - set(theirs)):
        p.add("upstream", f"{eid}: in a shard but not in the upstream inventory")
    for eid in sorted(set(ours) & set(theirs)):
        mine, up = ours[eid], theirs[eid]
        stale = [k for k in lib.FACT_KEYS[up["kind"]] if mine.get(k) != up[k]]
        if stale:
            p.add("upstream", f"{eid}: facts differ from the reference data ({', '.join(stale)}); "
                  "run scripts/compat/extract_manifest.py")
    have, want = lib.inventory_of(entries), lib.inventory_of(facts)
    for key in want:
        if have.get(key) != want[key]:
            p.add("upstream", f"inventory {key}: shards hold {have.get(key)}, upstream has {want[key]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manifest-dir", type=Path, default=lib.MANIFEST_DIR)
    ap.add_argument("--shared", type=Path, default=lib.SHARED_DIR,
                    help="the shared reference data root (skipped when absent)")
    ap.add_argument("--repo-root", type=Path, default=lib.REPO_ROOT,
                    help="where test pointers are resolved")
    args = ap.parse_args(argv)
    problems = validate(args.manifest_dir, args.shared, args.repo_root)
    for line in problems:
        print(line)
    if problems:
        print(f"{len(problems)} problem(s) in {args.manifest_dir}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

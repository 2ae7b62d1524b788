"""Check the manifest's ``mlxcel`` claim blocks against the live code.

A claim says what the binaries accept today.  These checks hold the
manifest and the code together in both directions:

* options, against the real argparse parsers of both server entry points
  (``mlxcel-server`` and ``mlxcel serve``) and their --dump-flag-surface:
  every claimed spelling parses (on both binaries unless the claim says
  ``accepted_on_one_binary_only``), every upstream spelling an entry does
  not claim parses on neither, claimed variables bind, defaults and
  visibility match, and an option the parser accepts that no entry claims
  is an error;
* routes, against ``mlxcel_trio.protocol.routes.ROUTES``: a claimed route is
  mounted, an unclaimed upstream route is not, a mounted route without a
  claim (in an upstream shard, or as an mlxcel-only route in the extensions
  file) is an error;
* native request fields, against ``mlxcel_trio.protocol.fields.NATIVE_FIELDS``
  the same way, plus the field's status against the entry's state.

Every check takes the table it checks as a parameter, so a test can hand
it a modified copy (an option table without one flag, ROUTES plus one)
and watch it fail.  Each returns a list of one-line problems; empty means
the claims hold.

    python scripts/compat/claims.py [--manifest-dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import manifest_lib as lib  # noqa: E402

SERVER, SERVE = lib.BINARIES


# ---- loading ----------------------------------------------------------------

def load_entries(manifest_dir: Path = lib.MANIFEST_DIR) -> list[dict]:
    pin = lib.read(manifest_dir / lib.PIN)
    entries: list[dict] = []
    for name, spec in pin["shards"].items():
        entries.extend(lib.read(manifest_dir / spec["file"])["entries"])
    if "extensions" in pin:
        entries.extend(lib.read(manifest_dir / pin["extensions"]["file"])["entries"])
    return entries


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=list))


# ---- the live option surface -----------------------------------------------------

def live_surfaces() -> dict[str, dict]:
    """Each entry point's --dump-flag-surface, run in-process."""
    from mlxcel_trio.entry import mlxcel_main, server_main

    out: dict[str, dict] = {}
    for binary, call in ((SERVER, lambda: server_main(["--dump-flag-surface"])),
                         (SERVE, lambda: mlxcel_main(["serve", "--dump-flag-surface"]))):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = call()
        if rc != 0:
            raise RuntimeError(f"{binary} --dump-flag-surface exited {rc}")
        out[binary] = json.loads(buf.getvalue())
    return out


def table_surfaces(table: Sequence[Any]) -> dict[str, dict]:
    from mlxcel_trio.cli.surface import surface

    dump = _jsonable(surface(table))
    return {SERVER: dump, SERVE: dump}


def parsers(table: Sequence[Any]) -> dict[str, Any]:
    from mlxcel_trio.cli.parser import build_parser

    return {binary: build_parser(table, prog=binary) for binary in lib.BINARIES}


def option_strings(parser: Any) -> dict[str, str]:
    """spelling -> dest, for every option string the parser takes (argparse
    has no public listing: its private table is read here, in one place)."""
    return {s: action.dest for s, action in parser._option_string_actions.items()}


def _env_sample(record: dict, var: str) -> str:
    if record["kind"] == "flag" or var == record.get("env_negated"):
        return "1"
    if record["kind"] == "bool":
        return "true"
    default = record.get("default")
    if isinstance(default, list):
        return ",".join(str(v) for v in default) or "1"
    return "1" if default is None or isinstance(default, bool) else str(default)


def _binds(table: Sequence[Any], record: dict, var: str, prog: str) -> str | None:
    """None when setting `var` reaches the option, else why not."""
    from mlxcel_trio.cli.parser import CliError, parse

    try:
        parsed = parse([], env={var: _env_sample(record, var)}, table=table, prog=prog)
    except CliError as exc:  # a refused sample still proves the binding
        return None if f"(from {var})" in str(exc) else f"parsing failed: {exc}"
    if parsed.given.get(record["dest"]) == var:
        return None
    return f"{var} did not set {record['name']} (given: {parsed.given.get(record['dest'])!r})"


def option_problems(entries: Sequence[dict], table: Sequence[Any] | None = None,
                    check_env: bool = True) -> list[str]:
    """Option claims against the parsers and dumps of both entry points.
    `table` None means the real OPTIONS through the real entry points."""
    from mlxcel_trio.cli.options import OPTIONS

    real = table is None
    table = OPTIONS if real else table
    dumps = live_surfaces() if real else table_surfaces(table)
    accepted = {b: option_strings(p) for b, p in parsers(table).items()}
    records = {b: {r["dest"]: r for r in d["options"]} for b, d in dumps.items()}
    problems: list[str] = []
    claimed_dests: dict[str, str] = {}

    for entry in entries:
        if entry["kind"] != "option":
            continue
        where = f"option {entry['id']}"
        claim = entry.get("mlxcel")
        if claim is None:
            for b in lib.BINARIES:
                took = [s for s in entry["spellings"] if s in accepted[b]]
                if took:
                    problems.append(f"{where}: no claim, but {b} accepts {', '.join(took)}; "
                                    "flip the entry and claim what is accepted")
            continue
        spellings = claim.get("accepted_spellings", [])
        only = claim.get("accepted_on_one_binary_only")
        for b in lib.BINARIES:
            expect = only is None or only == b
            for s in spellings:
                if (s in accepted[b]) != expect:
                    verb = "does not accept" if expect else "accepts"
                    problems.append(f"{where}: {b} {verb} claimed spelling {s}")
            for s in entry["spellings"]:
                if s not in spellings and s in accepted[b]:
                    problems.append(f"{where}: {b} accepts upstream spelling {s}, which the "
                                    "claim does not list")
        binary = only or SERVER
        dests = {accepted[binary][s] for s in spellings if s in accepted[binary]}
        if len(dests) > 1:
            problems.append(f"{where}: claimed spellings reach different options {sorted(dests)}")
        if len(dests) != 1:
            continue
        dest = dests.pop()
        if dest in claimed_dests:
            problems.append(f"{where}: the option is also claimed by {claimed_dests[dest]}")
        claimed_dests[dest] = where
        rec = records[binary][dest]
        missing = [s for s in rec["spellings"] if s not in spellings]
        if missing:
            problems.append(f"{where}: the option also accepts {', '.join(missing)}, which the "
                            "claim does not list")
        problems += _option_record_problems(where, entry, claim, rec)
        if check_env:
            for var in claim.get("env", []):
                for b in lib.BINARIES:
                    if only is None or only == b:
                        why = _binds(table, rec, var, b)
                        if why:
                            problems.append(f"{where}: {b}: {why}")

    for b in lib.BINARIES:
        for dest, rec in records[b].items():
            if rec.get("upstream", True) and dest not in claimed_dests:
                problems.append(f"{b} accepts {rec['name']} ({', '.join(rec['spellings'])}) but "
                                "no manifest entry claims it")
    return problems


def _option_record_problems(where: str, entry: dict, claim: dict, rec: dict) -> list[str]:
    out = []
    env = sorted(claim.get("env", []))
    if env != sorted(rec["env"]):
        out.append(f"{where}: claimed env {env} but the option binds {sorted(rec['env'])}")
    if entry["state"] == "supported":
        lost = [v for v in entry["env"] if v not in rec["env"]]
        if lost:
            out.append(f"{where}: supported, but upstream's {', '.join(lost)} is not bound")
        if rec.get("refuses"):
            out.append(f"{where}: supported, but the option refuses some values at startup")
    binding = claim.get("env_binding")
    if binding is not None:
        want = "argparse" if rec["kind"] == "value" else "runtime"
        if binding != want:
            out.append(f"{where}: env_binding {binding!r}, but a {rec['kind']} option binds "
                       f"through {want!r}")
    if "defaults" in claim and claim["defaults"] != {rec["dest"]: rec["default"]}:
        out.append(f"{where}: claimed defaults {claim['defaults']} but the option's is "
                   f"{ {rec['dest']: rec['default']} }")
    if "hidden" in claim and claim["hidden"] != rec["hidden"]:
        out.append(f"{where}: claimed hidden={claim['hidden']} but the option has "
                   f"hidden={rec['hidden']}")
    return out


# ---- routes --------------------------------------------------------------------

def route_problems(entries: Sequence[dict], routes: Sequence[Any] | None = None) -> list[str]:
    if routes is None:
        from mlxcel_trio.protocol.routes import ROUTES as routes  # noqa: N811
    mounted = {(r.method, r.path): r for r in routes}
    problems: list[str] = []
    claimed: dict[tuple[str, str], str] = {}
    for entry in entries:
        if entry["kind"] == lib.EXTENSION_KIND:
            where = f"mlxcel-only route {entry['id']}"
            ours = (entry["method"], entry["path"])
            if entry.get("mlxcel") is None:
                if ours in mounted:
                    problems.append(f"{where}: mounted, but the entry has no claim")
                continue
            if ours not in mounted:
                problems.append(f"{where}: claims {ours[0]} {ours[1]}, which ROUTES does not mount")
            elif mounted[ours].public != entry["api_key_exempt"]:
                problems.append(f"{where}: its API-key exemption differs from ROUTES'")
            if ours in claimed:
                problems.append(f"{where}: {ours[0]} {ours[1]} is also claimed by {claimed[ours]}")
            claimed[ours] = where
            continue
        if entry["kind"] != "route":
            continue
        where = f"route {entry['id']}"
        upstream = (entry["method"], entry["path"])
        claim = entry.get("mlxcel")
        if claim is None:
            if upstream in mounted:
                problems.append(f"{where}: mounted, but the entry has no claim")
            continue
        route = claim.get("route") or {}
        ours = (route.get("method"), route.get("path"))
        if ours not in mounted:
            problems.append(f"{where}: claims {ours[0]} {ours[1]}, which ROUTES does not mount")
        if ours in claimed:
            problems.append(f"{where}: {ours[0]} {ours[1]} is also claimed by {claimed[ours]}")
        claimed[ours] = where
        if entry["state"] == "aliased" and upstream in mounted:
            problems.append(f"{where}: aliased, but upstream's own {upstream[0]} {upstream[1]} "
                            "is mounted too")
        if ours != upstream and entry["state"] != "aliased":
            problems.append(f"{where}: the claim names another route; only aliased may")
        if ours in mounted and entry["state"] == "supported" \
                and mounted[ours].public != entry["api_key_exempt"]:
            problems.append(f"{where}: supported, but its API-key exemption differs from upstream's")
    for key in mounted:
        if key not in claimed:
            problems.append(f"ROUTES mounts {key[0]} {key[1]} but no manifest entry claims it")
    return problems


# ---- native request fields -------------------------------------------------------

def field_path(field: Any) -> str:
    return f"{field.parent}.{field.name}" if field.parent else field.name


# Which NATIVE_FIELDS statuses each manifest state allows.  A field the table
# only validates ("deferred") is never supported; a "supported" field may still
# be a deferred entry when it is acted on but diverges (its divergence then says
# how, and must not claim the value is ignored).
FIELD_STATUS = {
    "supported": {"supported", "inert"},
    "by_design": {"supported", "inert"},
    "deferred": {"deferred", "supported"},
    "aliased": {"supported"},
    "not_applicable": {"deferred", "inert"},
}


def field_problems(entries: Sequence[dict], fields: Sequence[Any] | None = None) -> list[str]:
    if fields is None:
        from mlxcel_trio.protocol.fields import NATIVE_FIELDS as fields  # noqa: N811
    # a field upstream reads outside its schema table (id_slot) has no field entry
    table = {field_path(f): f for f in fields if getattr(f, "schema", True)}
    problems: list[str] = []
    claimed: dict[str, str] = {}
    for entry in entries:
        if entry["kind"] != "native_request_field":
            continue
        where = f"field {entry['id']}"
        claim = entry.get("mlxcel")
        if claim is None:
            if entry["id"] in table:
                problems.append(f"{where}: accepted (NATIVE_FIELDS has it), but the entry has "
                                "no claim")
            continue
        name = (claim.get("field") or {}).get("name")
        field = table.get(name)
        if field is None:
            problems.append(f"{where}: claims field {name!r}, which NATIVE_FIELDS lacks")
            continue
        if name in claimed:
            problems.append(f"{where}: {name} is also claimed by {claimed[name]}")
        claimed[name] = where
        if entry["state"] == "aliased" and entry["id"] in table:
            problems.append(f"{where}: aliased, but upstream's own name is accepted too")
        if name != entry["id"] and entry["state"] != "aliased":
            problems.append(f"{where}: the claim names another field; only aliased may")
        aliases = list(claim["field"].get("aliases", []))
        if aliases != list(field.aliases):
            problems.append(f"{where}: claimed aliases {aliases} but the field takes "
                            f"{list(field.aliases)}")
        if "defaults" in claim and claim["defaults"] != {name: _jsonable(field.default)}:
            problems.append(f"{where}: claimed defaults {claim['defaults']} but the field's is "
                            f"{_jsonable(field.default)!r}")
        allowed = FIELD_STATUS.get(entry["state"], set())
        if field.status not in allowed:
            problems.append(f"{where}: state {entry['state']!r} but NATIVE_FIELDS marks it "
                            f"{field.status!r}; flip the entry (or the field) so they agree")
        ignored = lib.IGNORED_FIELD in entry["divergence"]
        if field.status == "deferred" and entry["state"] == "deferred" and not ignored:
            problems.append(f"{where}: NATIVE_FIELDS only validates it, so the divergence must "
                            f"say {lib.IGNORED_FIELD!r}")
        if field.status != "deferred" and ignored:
            problems.append(f"{where}: NATIVE_FIELDS acts on it now, but the entry still says "
                            f"{lib.IGNORED_FIELD!r}; reclassify it")
    for path in table:
        if path not in claimed:
            problems.append(f"NATIVE_FIELDS accepts {path} but no manifest entry claims it")
    return problems


def all_problems(entries: Sequence[dict]) -> list[str]:
    return option_problems(entries) + route_problems(entries) + field_problems(entries)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="check the manifest's mlxcel claims against the code")
    ap.add_argument("--manifest-dir", type=Path, default=lib.MANIFEST_DIR)
    args = ap.parse_args(argv)
    problems = all_problems(load_entries(args.manifest_dir))
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

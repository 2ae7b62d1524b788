"""Shared vocabulary of the llama-server compatibility manifest.

The manifest lives in ``compat/llama-server/b<build>/``: ``pin.json`` (the
frozen upstream reference, its inventory counts and the shard owner map),
one JSON file per area shard, and ``_unclassified.json`` (must stay empty).
This module holds what the validator (scripts/ci/check_llama_compat_manifest.py),
the extractor (scripts/compat/extract_manifest.py), the claim checks
(scripts/compat/claims.py) and the count renderer (scripts/compat/render_counts.py)
all need to agree on:

* the entry kinds and their fact keys, the seven policy keys and the nine
  claim keys, in canonical order;
* the canonical serialization;
* how the upstream reference data (``../shared/upstream/llama-server``) is
  turned into the fact half of every entry.

Standard library only: the validator runs offline, before anything is
installed.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any, Iterable

SCHEMA_VERSION = 4

REPO_ROOT = Path(__file__).resolve().parents[2]
MANIFEST_DIR = REPO_ROOT / "compat" / "llama-server" / "b10587"
SHARED_DIR = REPO_ROOT.parent / "shared"
UPSTREAM_SUBDIR = Path("upstream") / "llama-server"

PIN = "pin.json"
UNCLASSIFIED = "_unclassified.json"

# mlxcel-only routes (no upstream counterpart at the pinned release, e.g. the
# OpenAI Responses retrieve / cancel pair) live apart from the upstream shards,
# in one extensions file that pin.json lists under "extensions": they are not
# upstream inventory, so they never count there, and an extension may not
# shadow an upstream id.  Each entry names the API whose contract it follows
# (`reference`) and is classified against that contract.
EXTENSIONS = "mlxcel-extensions.json"
EXTENSIONS_SHARD = "mlxcel-extensions"
EXTENSION_KIND = "mlxcel_route"
EXTENSION_FACT_KEYS = ("kind", "id", "method", "path", "api_key_exempt", "reference")
EXTENSION_STATES = ("supported", "deferred", "by_design")

# The divergence string that marks a native field accepted, validated and then
# ignored; the claim checks hold it in step with NATIVE_FIELDS' "deferred" status.
IGNORED_FIELD = "the value is validated and then ignored"

STATES = ("supported", "aliased", "not_applicable", "deferred", "by_design")
# States whose entry must name the issue that owns it.
NEEDS_ISSUE = ("aliased", "not_applicable", "deferred")
HONEST_ALTERNATIVES = ("aliased", "not_applicable", "deferred", "by_design")

POLICY_KEYS = ("state", "issue", "test", "notes", "divergence", "rationale", "mlxcel")
FACT_KEYS: dict[str, tuple[str, ...]] = {
    "option": ("kind", "id", "spellings", "env", "default", "value_hint", "section"),
    "route": ("kind", "id", "method", "path", "api_key_exempt", "registered_when"),
    "native_request_field": ("kind", "id", "name", "aliases", "value_kind", "default",
                             "limits", "compiled_out"),
}
KINDS = tuple(FACT_KEYS)

CLAIM_KEYS = ("accepted_spellings", "accepted_on_one_binary_only", "env", "env_binding",
              "env_test", "defaults", "hidden", "route", "field")
ENV_BINDINGS = ("argparse", "runtime")
BINARIES = ("mlxcel-server", "mlxcel serve")
RATIONALE_KEYS = ("kind", "reason", "revisit_if")
RATIONALE_KINDS = ("architectural", "policy")

# The area shards, in a stable order (pin.json lists them in this order).
SHARD_NAMES = (
    "transport-tls-cors", "authentication", "logging-and-presets", "routes",
    "observability-and-slots", "streams-and-realtime", "chat-templates",
    "sampling-and-grammar", "runtime-and-context", "model-source", "ggml-runtime",
    "ui-tools-mcp-gcp", "embeddings-and-rerank", "router-models", "lora-adapters",
    "multimodal-and-audio", "speculative",
)


# ---- serialization -----------------------------------------------------------

def canonical(obj: Any) -> str:
    """The one accepted byte form of every manifest file."""
    return json.dumps(obj, indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def write(path: Path, obj: Any) -> bool:
    """Write `obj` canonically; True when the bytes changed."""
    text = canonical(obj)
    old = path.read_text(encoding="utf-8") if path.exists() else None
    if old == text:
        return False
    path.write_text(text, encoding="utf-8")
    return True


def read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def shard_file(name: str) -> str:
    return f"{name}.json"


def shard_document(name: str, entries: Iterable[dict]) -> dict:
    return {"schema_version": SCHEMA_VERSION, "shard": name,
            "entries": sorted(entries, key=lambda e: e["id"])}


def unclassified_document(entries: Iterable[dict]) -> dict:
    return {"schema_version": SCHEMA_VERSION, "entries": sorted(entries, key=lambda e: e["id"])}


def skeleton_policy() -> dict:
    """The policy half of an entry nobody has classified yet."""
    return {"state": None, "issue": None, "test": None, "notes": "", "divergence": [],
            "rationale": None, "mlxcel": None}


def assemble(facts: dict, policy: dict) -> dict:
    """Facts in their kind's order, then the seven policy keys in theirs."""
    entry = {key: facts[key] for key in FACT_KEYS[facts["kind"]]}
    base = skeleton_policy()
    for key in POLICY_KEYS:
        entry[key] = policy.get(key, base[key])
    return entry


def split(entry: dict) -> tuple[dict, dict]:
    kind = entry.get("kind")
    facts = {k: entry.get(k) for k in FACT_KEYS.get(kind, ())}
    policy = {k: entry[k] for k in POLICY_KEYS if k in entry}
    return facts, policy


# ---- the upstream reference data -> facts ------------------------------------

def upstream_dir(shared: Path) -> Path:
    return shared / UPSTREAM_SUBDIR


def have_upstream(shared: Path = SHARED_DIR) -> bool:
    d = upstream_dir(shared)
    return all((d / f).is_file() for f in ("options.json", "routes.json",
                                          "native_completion_fields.json"))


def _first_long(spellings: list[str]) -> str:
    for s in spellings:
        if s.startswith("--"):
            return s
    return spellings[0]


def option_facts(options_json: dict) -> list[dict]:
    """One fact record per help entry, plus the RPC-only --rpc entry."""
    out = []
    for rec in options_json["options"]:
        out.append({"kind": "option", "id": _first_long(rec["spellings"]),
                    "spellings": list(rec["spellings"]), "env": list(rec["env"]),
                    "default": rec["default"], "value_hint": rec["value_hint"],
                    "section": rec["section"]})
    for rec in options_json.get("registered_only_with_rpc_support", []):
        out.append({"kind": "option", "id": _first_long(rec["spellings"]),
                    "spellings": list(rec["spellings"]),
                    "env": [rec["env"]] if rec.get("env") else [],
                    "default": rec.get("default"), "value_hint": rec.get("value_hint"),
                    "section": None})
    return out


_VAR_PATH = re.compile(r"^(\$[A-Z_]+)(?:\s*\(default\s+(\S+)\))?$")


def route_facts(routes_json: dict) -> list[dict]:
    """One fact record per (method, path) pair, plus the two Vertex AI pairs."""
    out = []
    for rec in routes_json["routes"]:
        when = "router mode" if rec.get("router_mode_only") else "always"
        out.append({"kind": "route", "id": f"{rec['method']} {rec['path']}",
                    "method": rec["method"], "path": rec["path"],
                    "api_key_exempt": bool(rec.get("api_key_exempt")),
                    "registered_when": when})
    for rec in routes_json.get("gcp_compat_routes", []):
        m = _VAR_PATH.match(rec["path"])
        path = m.group(1) if m else rec["path"]
        when = rec["when"]
        if m and m.group(2):
            when += f"; the path defaults to {m.group(2)}"
        out.append({"kind": "route", "id": f"{rec['method']} {path}",
                    "method": rec["method"], "path": path, "api_key_exempt": False,
                    "registered_when": when})
    return out


def _limits(rec: dict) -> dict | None:
    lim = rec.get("limits")
    if not lim:
        return None
    return {"min": lim.get("min_value"), "max": lim.get("max_value"), "hard": bool(lim["hard"])}


def field_facts(fields_json: dict) -> list[dict]:
    """One fact record per field construction of the native schema."""
    out = []
    for rec in fields_json["fields"]:
        out.append({"kind": "native_request_field", "id": rec.get("json_path") or rec["name"],
                    "name": rec["name"], "aliases": list(rec.get("aliases") or []),
                    "value_kind": rec["kind"], "default": rec.get("struct_default"),
                    "limits": _limits(rec), "compiled_out": bool(rec["compiled_out_by_if0"])})
    return out


def upstream_facts(shared: Path = SHARED_DIR) -> list[dict]:
    d = upstream_dir(shared)
    return (option_facts(read(d / "options.json")) + route_facts(read(d / "routes.json"))
            + field_facts(read(d / "native_completion_fields.json")))


def upstream_release(shared: Path = SHARED_DIR) -> dict:
    d = upstream_dir(shared)
    ref = read(d / "options.json")["reference"]
    version = (d / "version.txt").read_text(encoding="utf-8").splitlines()[0].strip() \
        if (d / "version.txt").is_file() else ref.get("version_txt")
    m = re.search(r"build (\d+)", version or "")
    build = int(m.group(1)) if m else None
    return {
        "name": f"b{build}" if build is not None else ref["describe"],
        "git_describe": ref["describe"],
        "build": build,
        "commit": ref["commit"],
        "commit_date": ref["commit_date"],
        "version_txt": version,
        "obtained": (ref.get("build", "a source build").replace(" from source here",
                                                                 " from source")
                     + ", made for this project; its --help and --version output and the "
                     "facts read from its sources were extracted into the shared reference "
                     "data, which the extractor reads"),
        "reference_data": "../shared/upstream/llama-server (help.txt, options.json, "
                          "routes.json, native_completion_fields.json)",
        "spec_release": "b10621",
    }


def inventory_of(entries: Iterable[dict]) -> dict:
    """The counts pin.json pins, computed from fact records (or entries)."""
    entries = list(entries)
    options = [e for e in entries if e["kind"] == "option"]
    routes = [e for e in entries if e["kind"] == "route"]
    fields = [e for e in entries if e["kind"] == "native_request_field"]
    gcp = [r for r in routes if r["registered_when"] not in ("always", "router mode")]
    longs = {s for e in options for s in e["spellings"] if s.startswith("--")}
    envs = {v for e in options for v in e["env"]}
    return {
        "options": len(options),
        "help_entries": sum(1 for e in options if e["section"] is not None),
        "long_spellings": len(longs),
        "env_vars": len(envs),
        "routes": len(routes),
        "route_pairs": len(routes) - len(gcp),
        "route_pairs_router_only": sum(1 for r in routes if r["registered_when"] == "router mode"),
        "gcp_route_pairs": len(gcp),
        "native_request_fields": len(fields),
        "native_request_fields_compiled_out": sum(1 for f in fields if f["compiled_out"]),
    }


# ---- test pointers -------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _parse(path: str) -> Any:
    import ast

    try:
        return ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)
    except SyntaxError as exc:
        return exc.msg or "syntax error"


_NODE = re.compile(r"^(?P<file>[^:\[\]]+\.py)(?P<parts>(::[A-Za-z_][A-Za-z0-9_]*)+)"
                   r"(?P<param>\[.*\])?$")


def resolve_test(node: str, repo: Path = REPO_ROOT) -> str | None:
    """None when `node` names a real pytest item (file, class, test function;
    a [param] suffix allowed), else why not.  Parsed with ast, never run."""
    import ast

    m = _NODE.match(node)
    if not m:
        return "is not a pytest node id (path/to/test_x.py::test_name)"
    path = repo / m.group("file")
    if not path.is_file():
        return f"names a file that does not exist ({m.group('file')})"
    tree = _parse(str(path))
    if isinstance(tree, str):
        return f"names a file that does not parse ({tree})"
    parts = m.group("parts").split("::")[1:]
    scope: list[ast.stmt] = tree.body
    for i, name in enumerate(parts):
        last = i == len(parts) - 1
        found = None
        for node_ in scope:
            if isinstance(node_, ast.ClassDef) and node_.name == name and not last:
                found = node_
            elif isinstance(node_, ast.ClassDef) and node_.name == name and last:
                found = node_ if name.startswith("Test") else None
            elif (isinstance(node_, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and node_.name == name and last and name.startswith("test")):
                found = node_
        if found is None:
            return f"names no test {'::'.join(parts[:i + 1])} in {m.group('file')}"
        scope = getattr(found, "body", [])
    return None

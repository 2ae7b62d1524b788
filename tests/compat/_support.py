"""Shared helpers for the manifest tests: the script modules, the paths, and
throwaway copies of the manifest to break one rule at a time."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "compat"))

import claims  # noqa: E402
import manifest_lib as lib  # noqa: E402

VALIDATOR = REPO / "scripts" / "ci" / "check_llama_compat_manifest.py"
EXTRACTOR = REPO / "scripts" / "compat" / "extract_manifest.py"
MANIFEST = lib.MANIFEST_DIR
HAVE_SHARED = lib.have_upstream(lib.SHARED_DIR)
needs_shared = pytest.mark.skipif(not HAVE_SHARED, reason="../shared reference data absent")

__all__ = ["REPO", "VALIDATOR", "EXTRACTOR", "MANIFEST", "HAVE_SHARED", "needs_shared",
           "claims", "lib", "copy_manifest", "run_validator", "edit_entry", "edit_file",
           "find_entry", "all_entries"]


def copy_manifest(dest: Path) -> Path:
    target = dest / "manifest"
    shutil.copytree(MANIFEST, target)
    return target


def run_validator(manifest_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(VALIDATOR), "--manifest-dir", str(manifest_dir),
                           *extra], capture_output=True, text=True, timeout=60)


def all_entries(manifest_dir: Path) -> list[tuple[str, dict]]:
    """(file name, entry) for every entry of every shard."""
    pin = lib.read(manifest_dir / lib.PIN)
    out = []
    for spec in pin["shards"].values():
        for entry in lib.read(manifest_dir / spec["file"])["entries"]:
            out.append((spec["file"], entry))
    return out


def find_entry(manifest_dir: Path, pred: Callable[[dict], bool]) -> tuple[str, dict]:
    for name, entry in all_entries(manifest_dir):
        if pred(entry):
            return name, entry
    raise LookupError("no entry matches")


def edit_file(path: Path, fn: Callable[[Any], Any]) -> None:
    doc = lib.read(path)
    result = fn(doc)
    lib.write(path, result if isinstance(result, dict) else doc)


def edit_entry(manifest_dir: Path, file: str, eid: str, fn: Callable[[dict], Any]) -> None:
    """Apply `fn` to one entry (it may mutate in place or return a replacement dict)
    and write the shard back canonically, so only the intended rule breaks."""
    def apply(doc: dict) -> dict:
        for i, entry in enumerate(doc["entries"]):
            if entry["id"] == eid:
                result = fn(entry)
                doc["entries"][i] = result if isinstance(result, dict) else entry
                return doc
        raise LookupError(eid)
    edit_file(manifest_dir / file, apply)

"""docs/compatibility.md carries the manifest's current state counts."""

from __future__ import annotations

import sys

from ._support import REPO, lib

sys.path.insert(0, str(REPO / "scripts" / "compat"))

import render_counts  # noqa: E402

DOC = REPO / "docs" / "compatibility.md"


def test_the_counts_table_is_up_to_date() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert render_counts.render(text, render_counts.counts_table(lib.MANIFEST_DIR)) == text, (
        "docs/compatibility.md is stale: run python scripts/compat/render_counts.py")


def test_the_table_covers_every_shard_and_state() -> None:
    table = render_counts.counts_table(lib.MANIFEST_DIR)
    for name in lib.read(lib.MANIFEST_DIR / lib.PIN)["shards"]:
        assert f"`{name}.json`" in table
    for state in lib.STATES:
        assert f"| {state} " in table.splitlines()[2]


def test_a_changed_state_makes_the_doc_stale(tmp_path) -> None:
    from ._support import copy_manifest, edit_entry, find_entry

    m = copy_manifest(tmp_path)
    file, e = find_entry(m, lambda e: e["state"] == "deferred")
    edit_entry(m, file, e["id"], lambda x: x.update(state="not_applicable"))
    text = DOC.read_text(encoding="utf-8")
    assert render_counts.render(text, render_counts.counts_table(m)) != text

"""The tool-call conformance data (tests/data/tool_calls) against its generator.

The expected answers there come from upstream's parser and cannot be
recomputed here, so these checks keep the rest honest: the stored outputs and
cases are exactly what make_corpus.py generates now (an edit to the corpus
without regenerating the answers fails), every answer a case names exists,
and the templates are the upstream collection's, byte for byte, where that
collection is beside the checkout.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

DATA = Path(__file__).parents[2] / "data" / "tool_calls"
_COLLECTION = Path(__file__).parents[4] / "shared" / "upstream" / "chat-templates"


def _make_corpus():
    spec = importlib.util.spec_from_file_location("make_corpus", DATA / "make_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_GEN = _make_corpus()
_STORED = {p.stem: json.loads(p.read_text("utf-8")) for p in sorted(DATA.glob("*.json"))}


def test_the_stored_corpus_is_what_the_generator_writes():
    stored = [(d, g) for d, data in _STORED.items() for g in data["groups"]]
    generated = _GEN.corpus()
    key = lambda g: (g["template"], g["syntax"], json.dumps(g["setting"], sort_keys=True))  # noqa: E731
    by_key = {key(g): (d, g) for d, g in stored}
    assert sorted(by_key) == sorted(key(g) for g in generated)
    for g in generated:
        dialect, s = by_key[key(g)]
        assert dialect == g["dialect"]
        assert s["outputs"] == g["outputs"], g["template"]
        assert [c[:3] for c in s["cases"]] == [[c["output"], c["len"], int(c["partial"])] for c in g["cases"]]


@pytest.mark.parametrize("dialect", sorted(_STORED))
def test_every_case_names_an_answer(dialect):
    data = _STORED[dialect]
    assert data["tools"] == _GEN.TOOLS
    for g in data["groups"]:
        assert all(0 <= c[3] < len(g["results"]) for c in g["cases"])
        for r in g["results"]:
            assert set(r) == {"error"} or set(r) == {"content", "reasoning_content", "tool_calls"}


def test_the_templates_are_there():
    used = {t for _, t, _, _ in _GEN.FAMILIES}
    assert used == {p.name for p in (DATA / "templates").iterdir()}


@pytest.mark.skipif(not _COLLECTION.exists(), reason="the upstream template collection is not beside the checkout")
def test_the_templates_are_upstreams():
    for p in (DATA / "templates").iterdir():
        assert p.read_bytes() == (_COLLECTION / p.name).read_bytes(), p.name

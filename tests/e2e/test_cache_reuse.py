"""--cache-reuse / n_cache_reuse on a real server: after a span is cut out
of a cached prompt, the cached chunk behind the cut is reused by shifting
its KV (engine/kv_shift.py), which timings count as cached; at 0 only the
common prefix is.  Uses the shared server (the per-request field is the
option's default, so both arms run on one server)."""

from __future__ import annotations

import httpx
import pytest

from .sse import post

pytestmark = pytest.mark.e2e

GREEDY = {"temperature": 0.0, "seed": 1, "n_predict": 8}
KEEP, CUT = 12, 10


def _ids(srv, tag: str) -> list[int]:
    text = " ".join(f"{tag}{i % 13} word{i}" for i in range(40))
    r = httpx.post(f"{srv.url}/tokenize", json={"content": text}, timeout=60)
    return r.json()["tokens"]


def _edited(srv, tag: str) -> tuple[list[int], list[int]]:
    ids = _ids(srv, tag)
    assert len(ids) > KEEP + CUT + 40
    return ids, ids[:KEEP] + ids[KEEP + CUT:]


def _run(srv, prompt, **kw) -> dict:
    r = post(srv.url, {"prompt": prompt, **GREEDY, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_cut_prompt_reuses_the_chunk_behind_the_cut(server):
    whole, cut = _edited(server, "shift")
    _run(server, whole)
    t = _run(server, cut, n_cache_reuse=8)["timings"]
    # everything but the last token: the prefix and the shifted chunk
    assert (t["cache_n"], t["prompt_n"]) == (len(cut) - 1, 1), t


def test_without_reuse_only_the_prefix_is_cached(server):
    whole, cut = _edited(server, "plain")
    _run(server, whole)
    t = _run(server, cut, n_cache_reuse=0)["timings"]
    assert (t["cache_n"], t["prompt_n"]) == (KEEP, len(cut) - KEEP), t


def test_a_chunk_under_the_minimum_is_not_reused(server):
    whole, cut = _edited(server, "short")
    _run(server, whole)
    t = _run(server, cut, n_cache_reuse=len(cut))["timings"]
    assert t["cache_n"] == KEEP, t


def test_the_reused_output_reads_as_the_cold_one(server):
    whole, cut = _edited(server, "same")
    cold = _run(server, cut, cache_prompt=False)
    _run(server, whole)
    warm = _run(server, cut, n_cache_reuse=8)
    assert warm["timings"]["cache_n"] == len(cut) - 1
    assert warm["content"] == cold["content"]

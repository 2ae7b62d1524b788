"""--cache-reuse / n_cache_reuse on a real server: after a span is cut out
of a cached prompt, the cached chunk behind the cut is reused by shifting
its KV (engine/kv_shift.py), which timings count as cached; at 0 only the
common prefix is.  The per-request arms use the shared server (the field
is the option's default, so both run on one server); the last test starts
its own with the flag itself, as a copied command line gives it."""

from __future__ import annotations

import httpx
import pytest

from ..conftest import wait_until
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


def _shifted(srv) -> float:
    r = httpx.get(f"{srv.url}/metrics", timeout=30)
    assert r.status_code == 200, r.text
    line = next(ln for ln in r.text.splitlines()
                if ln.startswith("mlxcel_prompt_cache_shifted_tokens"))
    return float(line.split()[-1])


def _logprobs(body: dict) -> list[float]:
    return [t["logprob"] for t in body["completion_probabilities"]]


def test_the_cli_flag_shifts_without_the_field(tiny_draft_model, start_server):
    """`--cache-reuse 8` alone (no n_cache_reuse in the request): the chunk
    behind the cut is shifted, counted in timings and /metrics and said at
    load.  On a one-layer model a layer's keys depend only on their token
    and position, so re-rotating them is exact: the shifted run's greedy
    text and log-probabilities equal a cold prefill's (the uncut prompt's
    differ by ~1e-2, so a wrong rotation could not pass)."""
    srv = start_server(tiny_draft_model, "--cache-reuse", "8", "--metrics", "-np", "1",
                       "-c", "1024")
    srv.wait_for_text("cache reuse on: cached chunks of 8 or more tokens")
    whole, cut = _edited(srv, "flag")
    cold = _run(srv, cut, cache_prompt=False, n_probs=1)
    _run(srv, whole)
    before = _shifted(srv)
    warm = _run(srv, cut, n_probs=1)
    assert (warm["timings"]["cache_n"], warm["timings"]["prompt_n"]) == (len(cut) - 1, 1), \
        warm["timings"]
    assert warm["content"] == cold["content"]
    assert _logprobs(warm) == pytest.approx(_logprobs(cold), abs=1e-3)
    moved = len(cut) - 1 - KEEP
    wait_until(lambda: _shifted(srv) - before, "shifted tokens counted",
               until=lambda n: n == moved)

"""The prompt cache on architectures whose caches cannot be cut back, on a
real server: tiny-swa (gemma3_text, a 32-token sliding window) and
tiny-hybrid (lfm2, recurrent conv layers).  A follow-up chat turn restarts
from the snapshot the previous turn left, and its greedy output equals a
cold run's (cache_prompt: false neither looks up nor donates)."""

from __future__ import annotations

import re

import httpx
import pytest

from .sse import post

pytestmark = pytest.mark.e2e

GREEDY = {"temperature": 0.0, "seed": 1}
SYSTEM = " ".join(f"rule{i % 13} says item{i} matters" for i in range(40))


@pytest.fixture(scope="module", params=["tiny-swa", "tiny-hybrid"])
def windowed(request, start_server):
    from fixtures.build import ensure

    return start_server(ensure(request.param), "-c", "2048", "-np", "2")


def _chat(srv, messages, **kw):
    r = post(srv.url, {"model": "m", "messages": messages, "max_tokens": 8, **GREEDY, **kw},
             path="/v1/chat/completions")
    assert r.status_code == 200, r.text
    j = r.json()
    cached = j["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == j["timings"]["cache_n"]
    return j["choices"][0]["message"]["content"], cached, j["usage"]["prompt_tokens"]


def test_follow_up_turn_reuses_the_previous_turns(windowed):
    turn1 = [{"role": "system", "content": SYSTEM},
             {"role": "user", "content": "first question about item3"}]
    reply, cached1, n1 = _chat(windowed, turn1)
    turn2 = [*turn1, {"role": "assistant", "content": reply},
             {"role": "user", "content": "and a second one about item7"}]
    cold, cold_cached, n2 = _chat(windowed, turn2, cache_prompt=False)
    assert cold_cached == 0 and n2 > n1
    warm, cached2, _ = _chat(windowed, turn2)
    # the whole first prompt (but the token its first decode step fed) came
    # from a snapshot; the sliding window and the recurrent state could not
    # have been cut back to it
    assert cached2 >= n1 - 1, (cached2, n1)
    assert warm == cold
    line = windowed.wait_for_text(f"prompt {n2 - cached2} tokens ({cached2} cached, cache memory)")
    assert "stop:" in line


def test_metrics_count_lookups_by_tier(tiny_model, start_server):
    from fixtures.build import ensure

    srv = start_server(ensure("tiny-hybrid"), "-c", "2048", "-np", "1", "--metrics")
    prompt = SYSTEM
    for _ in range(2):
        r = post(srv.url, {"prompt": prompt, "n_predict": 4, **GREEDY})
        assert r.status_code == 200, r.text
    assert r.json()["timings"]["cache_n"] > 0
    body = httpx.get(srv.url + "/metrics", timeout=30).text

    def value(name, tier):
        m = re.search(rf'^{name}_total{{tier="{tier}"}} (\S+)$', body, re.M)
        assert m, body
        return float(m.group(1))

    assert value("mlxcel_prompt_cache_lookups", "none") == 1
    assert value("mlxcel_prompt_cache_lookups", "memory") == 1
    assert value("mlxcel_prompt_cache_lookups", "disk") == 0
    assert value("mlxcel_prompt_cache_reused_tokens", "memory") == r.json()["timings"]["cache_n"]


# -- the disk tier ---------------------------------------------------------------

LONG = " ".join(f"clause{i % 11} binds party{i} to term{i % 7}" for i in range(120))


def _complete(srv, prompt, **kw):
    r = post(srv.url, {"prompt": prompt, "n_predict": 8, **GREEDY, **kw})
    assert r.status_code == 200, r.text
    j = r.json()
    return j["content"], j["timings"]["cache_n"], j["tokens_evaluated"]


def _filled_dir(start_server, model, tmp_path):
    """A disk tier that one server filled with LONG's entries, then stopped."""
    disk = tmp_path / "cache"
    srv = start_server(model, "-c", "4096", "-np", "1", "--cache-disk", str(disk))
    _, _, n = _complete(srv, LONG + " first ending")
    assert n > 512    # long enough for a snapshot every SNAPSHOT_EVERY tokens
    srv.stop()
    files = sorted(disk.glob("*.safetensors"))
    assert files, "the disk tier wrote nothing"
    return disk, files


@pytest.mark.parametrize("kind", ["tiny-hybrid", "tiny-swa"])
def test_restart_hits_the_disk_tier_with_cold_output(kind, start_server, tmp_path):
    from fixtures.build import ensure

    model = ensure(kind)
    disk, _ = _filled_dir(start_server, model, tmp_path)
    srv = start_server(model, "-c", "4096", "-np", "1", "--cache-disk", str(disk),
                       "--metrics")
    follow = LONG + " another ending entirely"
    cold, cold_cached, n = _complete(srv, follow, cache_prompt=False)
    assert cold_cached == 0
    warm, cached, _ = _complete(srv, follow)
    assert cached >= 512, cached
    assert warm == cold
    srv.wait_for_text(f"({cached} cached, cache disk)")
    body = httpx.get(srv.url + "/metrics", timeout=30).text
    assert 'mlxcel_prompt_cache_lookups_total{tier="disk"} 1.0' in body
    # an idle writer never fell behind: nothing was dropped, and it is counted
    assert "mlxcel_prompt_cache_disk_writes_dropped_total 0.0" in body


def test_corrupt_truncated_and_foreign_files_are_skipped(start_server, tmp_path):
    from fixtures.build import ensure
    from safetensors.numpy import save_file
    import numpy as np

    model = ensure("tiny-hybrid")
    disk, files = _filled_dir(start_server, model, tmp_path)
    # every file the first server wrote is damaged: one byte flipped in the
    # data (the checksum catches it on the hit); a half of one is copied
    # under another file name (the index cannot read its header)
    (disk / ("e" * 64 + ".safetensors")).write_bytes(files[0].read_bytes()[:2000])
    for f in files:
        raw = bytearray(f.read_bytes())
        data = 8 + int.from_bytes(raw[:8], "little")   # past the header: layer arrays
        raw[data + 16] ^= 0xFF
        f.write_bytes(bytes(raw))
    (disk / "notes.txt").write_text("not a cache file")
    save_file({"tokens": np.arange(4, dtype=np.int32)},
              str(disk / ("0" * 64 + ".safetensors")), metadata={"format": "someone-else/9"})
    (disk / ("f" * 64 + ".safetensors")).write_bytes(b"\x00" * 100)

    srv = start_server(model, "-c", "4096", "-np", "1", "--cache-disk", str(disk))
    srv.wait_for_text("skipping notes.txt")
    srv.wait_for_text(f"skipping {'0' * 64}.safetensors: format 'someone-else/9'")
    srv.wait_for_text(f"skipping {'f' * 64}.safetensors: unreadable")
    srv.wait_for_text(f"skipping {'e' * 64}.safetensors: unreadable")
    follow = LONG + " another ending entirely"
    cold, _, _ = _complete(srv, follow, cache_prompt=False)
    warm, cached, _ = _complete(srv, follow)
    assert warm == cold and cached == 0
    srv.wait_for_text("checksum mismatch")

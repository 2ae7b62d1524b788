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

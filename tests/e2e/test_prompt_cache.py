"""The prompt cache on a real server: a cache must be the same as no cache.

The differential gate (the spec's prompt-cache gate): per-position tokens and
logprobs agree exactly between a cold evaluation (cache_prompt: false), the
evaluation that fills the cache, and a cache hit, on every route that
caches; the same-width arms run one request at a time.  The concurrent arm
runs three prompts of different lengths at once and compares each with its
solo run, judged on the first divergence and the solo run's own top-two gap
there: a decode at batch width three runs other kernels than at width one,
and after one flipped token everything downstream is conditioned on other
text, so the cascade says nothing about the cache.
"""

from __future__ import annotations

import threading

import httpx
import pytest

from .sse import post

pytestmark = pytest.mark.e2e

N_PREDICT = 12
TOP = 3
GREEDY = {"temperature": 0.0, "seed": 1}
# A top-two logprob gap at or above this is a decided position: a flip there
# is not kernel jitter (the spec's threshold).
DECIDED_GAP = 2.0


def _words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i % 17} item{i}" for i in range(n))


# -- per-route request and reading --------------------------------------------------


def _native(srv, path, prompt, **kw):
    r = post(srv.url, {"prompt": prompt, "n_predict": N_PREDICT, "n_probs": TOP, **GREEDY, **kw},
             path=path)
    assert r.status_code == 200, r.text
    j = r.json()
    trace = [(e["id"], e["logprob"], [(t["id"], t["logprob"]) for t in e["top_logprobs"]])
             for e in j["completion_probabilities"]]
    n = j["tokens_evaluated"]
    assert j["tokens_cached"] == n + j["tokens_predicted"] - 1
    assert j["timings"]["prompt_n"] == n - j["timings"]["cache_n"]
    return trace, j["timings"]["cache_n"], n


def _infill(srv, prompt, **kw):
    half = len(prompt) // 2
    r = post(srv.url, {"input_prefix": prompt[:half], "input_suffix": prompt[half:],
                       "n_predict": N_PREDICT, "n_probs": TOP, **GREEDY, **kw}, path="/infill")
    assert r.status_code == 200, r.text
    j = r.json()
    trace = [(e["id"], e["logprob"], [(t["id"], t["logprob"]) for t in e["top_logprobs"]])
             for e in j["completion_probabilities"]]
    return trace, j["timings"]["cache_n"], j["tokens_evaluated"]


def _v1_completions(srv, prompt, **kw):
    r = post(srv.url, {"model": "m", "prompt": prompt, "max_tokens": N_PREDICT, "n_probs": TOP,
                       **GREEDY, **kw}, path="/v1/completions")
    assert r.status_code == 200, r.text
    j = r.json()
    trace = [(e["id"], e["logprob"], [(t["id"], t["logprob"]) for t in e["top_logprobs"]])
             for e in j["choices"][0]["logprobs"]["content"]]
    cached = j["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == j["timings"]["cache_n"]
    return trace, cached, j["usage"]["prompt_tokens"]


def _chat(path):
    def run(srv, prompt, **kw):
        r = post(srv.url, {"model": "m", "messages": [{"role": "user", "content": prompt}],
                           "max_tokens": N_PREDICT, "logprobs": True, "top_logprobs": TOP,
                           **GREEDY, **kw}, path=path)
        assert r.status_code == 200, r.text
        j = r.json()
        trace = [(e["token"], e["logprob"], [(t["token"], t["logprob"]) for t in e["top_logprobs"]])
                 for e in j["choices"][0]["logprobs"]["content"]]
        cached = j["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached == j["timings"]["cache_n"]
        return trace, cached, j["usage"]["prompt_tokens"]
    return run


def _responses(srv, prompt, **kw):
    r = post(srv.url, {"model": "m", "input": prompt, "max_output_tokens": N_PREDICT,
                       **GREEDY, **kw}, path="/v1/responses")
    assert r.status_code == 200, r.text
    j = r.json()
    text = [c["text"] for o in j["output"] if o["type"] == "message" for c in o["content"]]
    return text, j["usage"]["input_tokens_details"]["cached_tokens"], j["usage"]["input_tokens"]


ROUTES = {
    "/completion": lambda srv, p, **kw: _native(srv, "/completion", p, **kw),
    "/completions": lambda srv, p, **kw: _native(srv, "/completions", p, **kw),
    "/v1/completions": _v1_completions,
    "/infill": _infill,
    "/v1/chat/completions": _chat("/v1/chat/completions"),
    "/chat/completions": _chat("/chat/completions"),
    "/v1/responses": _responses,
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_cold_hit_and_opt_out_agree_exactly(server, route):
    run = ROUTES[route]
    prompt = _words(f"r{list(ROUTES).index(route)}x", 25)
    cold, off_n, n = run(server, prompt, cache_prompt=False)
    assert off_n == 0
    fill, _, n2 = run(server, prompt)
    hit, hit_n, n3 = run(server, prompt)
    assert n == n2 == n3
    assert hit_n == n - 1, "the whole prompt but its last token comes from the cache"
    again, again_n, _ = run(server, prompt, cache_prompt=False)
    assert again_n == 0, "cache_prompt: false skips the lookup"
    assert cold == fill == hit == again
    # a prompt that extends the cached one adopts the cached prefix
    longer = prompt + " and then " + _words("x", 10)
    ext, ext_n, ext_total = run(server, longer)
    ref, _, _ = run(server, longer, cache_prompt=False)
    if route != "/infill":  # infill splits the text in two: no longer a prefix
        assert 0 < ext_n < ext_total
    if "completion" in route and "chat" not in route:  # raw text: all of it is a prefix
        assert n - 1 <= ext_n
    assert ext == ref


def test_messages_route_hits_and_agrees(server):
    body = {"model": "m", "max_tokens": N_PREDICT, "temperature": 0.0,
            "messages": [{"role": "user", "content": _words("an", 25)}]}
    first = post(server.url, body, path="/v1/messages").json()
    second = post(server.url, body, path="/v1/messages").json()
    total = first["usage"]["input_tokens"] + first["usage"]["cache_read_input_tokens"]
    assert second["usage"]["cache_read_input_tokens"] == total - 1
    assert second["usage"]["input_tokens"] == 1
    assert first["content"] == second["content"]
    # the streamed message_start reports the same split
    from .sse import stream_frames

    frames, _ = stream_frames(server.url, body, path="/v1/messages")
    start = next(f for f in frames if isinstance(f, dict) and f.get("type") == "message_start")
    assert start["message"]["usage"]["cache_read_input_tokens"] == total - 1
    assert start["message"]["usage"]["input_tokens"] == 1


def test_concurrent_arm_judged_on_first_divergence(server):
    prompts = [_words(f"c{k}", n) for k, n in ((1, 8), (2, 20), (3, 35))]
    solo = [_native(server, "/completion", p, cache_prompt=False)[0] for p in prompts]

    def concurrently() -> list:
        got: list = [None] * 3
        errors: list = []

        def one(i):
            try:
                got[i] = _native(server, "/completion", prompts[i])[:2]
            except Exception as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors and all(g is not None for g in got)
        return got

    # first round fills the cache; the second adopts three prefixes of
    # different lengths into one batch (mlx-lm left-pads them)
    for round_ in ("fill", "hit"):
        got = concurrently()
        if round_ == "hit":
            assert all(n > 0 for _, n in got), [n for _, n in got]
        for ref, (run, _) in zip(solo, got):
            for pos, (a, b) in enumerate(zip(ref, run)):
                if a[0] != b[0]:
                    top = sorted((lp for _, lp in a[2]), reverse=True)
                    gap = top[0] - top[1]
                    assert gap < DECIDED_GAP, (f"{round_}: diverged at {pos} where the solo "
                                               f"run's top-two gap is {gap:.3f}")
                    break


# -- namespaces ---------------------------------------------------------------------------


def test_raw_prompts_never_adopt_a_chat_prefix(tiny_model, start_server):
    srv = start_server(tiny_model, "-c", "2048", "-np", "1")
    try:
        messages = [{"role": "user", "content": _words("ns", 25)}]
        chat = post(srv.url, {"messages": messages, "max_tokens": 4, **GREEDY},
                    path="/v1/chat/completions").json()
        rendered = post(srv.url, {"messages": messages}, path="/apply-template").json()["prompt"]
        raw = post(srv.url, {"prompt": rendered, "n_predict": 4, **GREEDY}).json()
        assert raw["timings"]["cache_n"] == 0, "a raw prompt adopted a chat-rendered prefix"
        again = post(srv.url, {"prompt": rendered, "n_predict": 4, **GREEDY}).json()
        assert again["timings"]["cache_n"] == again["tokens_evaluated"] - 1
        chat2 = post(srv.url, {"messages": messages, "max_tokens": 4, **GREEDY},
                     path="/v1/chat/completions").json()
        assert chat2["usage"]["prompt_tokens_details"]["cached_tokens"] == \
            chat["usage"]["prompt_tokens"] - 1
    finally:
        srv.stop()


# -- the byte budget ----------------------------------------------------------------------


def _cache(srv) -> dict:
    return httpx.get(srv.url + "/props").json()["prompt_cache"]


def test_cache_ram_budget_holds_under_churn(tiny_model, start_server):
    # tiny: 2 layers x (K + V) x 2 heads x 16 dims x 4 bytes = 512 bytes per token,
    # so 1 MiB holds about 2048 tokens: three of these prompts (611 tokens), not eight
    srv = start_server(tiny_model, "-c", "4096", "-np", "1", "--cache-ram", "1")
    try:
        assert _cache(srv)["budget_bytes"] == 1024 * 1024
        for i in range(8):
            r = post(srv.url, {"prompt": _words(f"churn{i}_", 60), "n_predict": 2, **GREEDY})
            assert r.status_code == 200
            st = _cache(srv)
            assert 0 < st["bytes"] <= st["budget_bytes"]
        assert st["peak_bytes"] <= 1024 * 1024
        assert 1 <= st["entries"] < 8
        newest = post(srv.url, {"prompt": _words("churn7_", 60), "n_predict": 2,
                                **GREEDY}).json()
        assert newest["timings"]["cache_n"] > 0
        oldest = post(srv.url, {"prompt": _words("churn0_", 60), "n_predict": 2,
                                **GREEDY}).json()
        assert oldest["timings"]["cache_n"] <= 2, "the oldest prefix should have been evicted"
    finally:
        srv.stop()


def test_no_cache_prompt_is_the_request_default(tiny_model, start_server):
    """As upstream, --no-cache-prompt is the default of the request field; a
    request that asks for the cache still gets it."""
    srv = start_server(tiny_model, "-c", "2048", "-np", "1", "--no-cache-prompt")
    try:
        p = _words("off", 30)
        for _ in range(2):
            j = post(srv.url, {"prompt": p, "n_predict": 2, **GREEDY}).json()
            assert j["timings"]["cache_n"] == 0
        assert _cache(srv)["entries"] == 0, "an opted-out request donated"
        for want_hit in (False, True):
            j = post(srv.url, {"prompt": p, "n_predict": 2, "cache_prompt": True,
                               **GREEDY}).json()
            assert (j["timings"]["cache_n"] == j["tokens_evaluated"] - 1) is want_hit
    finally:
        srv.stop()


def test_cache_ram_zero_disables_the_cache(tiny_model, start_server):
    srv = start_server(tiny_model, "-c", "2048", "-np", "1", "--cache-ram", "0")
    try:
        assert _cache(srv)["enabled"] is False
        p = _words("zero", 30)
        for _ in range(2):
            j = post(srv.url, {"prompt": p, "n_predict": 2, **GREEDY}).json()
            assert j["timings"]["cache_n"] == 0
    finally:
        srv.stop()


def test_n_cache_reuse_is_validated(server):
    p = _words("reuse", 30)
    base = post(server.url, {"prompt": p, "n_predict": 4, **GREEDY}).json()
    j = post(server.url, {"prompt": p, "n_predict": 4, "n_cache_reuse": 256, **GREEDY}).json()
    assert j["content"] == base["content"]
    r = post(server.url, {"prompt": p, "n_cache_reuse": -1})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "Field 'n_cache_reuse': Value must be between 0 <= value <= 2147483647, but got -1")


def test_streamed_progress_counts_cached_tokens(server):
    from .sse import stream_frames

    p = _words("progress", 50)
    post(server.url, {"prompt": p, "n_predict": 2, **GREEDY})
    frames, _ = stream_frames(server.url, {"prompt": p, "n_predict": 2, "return_progress": True,
                                           **GREEDY})
    prog = [f["prompt_progress"] for f in frames if "prompt_progress" in f]
    assert prog and prog[0]["cache"] == prog[0]["total"] - 1
    assert prog[0]["processed"] == prog[0]["cache"]
    final = frames[-1]
    assert final["timings"]["cache_n"] == prog[0]["cache"]

"""The sampler chain, logit bias and probability reports on a real server.

Each test is built so that it fails if the stage it names were ignored:
a seeded request reproduces its tokens exactly, the empirical distribution
of many draws matches the distribution the server itself reports, and the
deterministic corner of each stage (mirostat with a tiny target, XTC that
always fires, a penalty against a forced token) gives a predictable text.
"""

from __future__ import annotations

import math

import pytest

from .sse import complete, error, post, stream_frames

pytestmark = pytest.mark.e2e

FULL_CHAIN = dict(temperature=0.9, dynatemp_range=0.3, dynatemp_exponent=1.5, top_k=30,
                  top_p=0.9, min_p=0.02, top_n_sigma=2.0, xtc_probability=0.5,
                  xtc_threshold=0.1, typical_p=0.95, repeat_last_n=32, repeat_penalty=1.1,
                  frequency_penalty=0.1, presence_penalty=0.1, dry_multiplier=0.8,
                  dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=32, min_keep=2)


@pytest.mark.parametrize("extra", [
    {}, FULL_CHAIN, {"mirostat": 1, "temperature": 1.2}, {"mirostat": 2, "mirostat_tau": 4.0},
    {"samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
                  "temperature", "adaptive_p"], "adaptive_target": 0.3},
], ids=["defaults", "full-chain", "mirostat-1", "mirostat-2", "adaptive-p"])
def test_a_seed_reproduces_the_same_tokens(server, tiny_facts, extra):
    body = dict(prompt=tiny_facts["long_prompt"], n_predict=20, ignore_eos=True,
                return_tokens=True, **{"temperature": 1.0, **extra})
    a = complete(server, seed=77, **body)
    b = complete(server, seed=77, **body)
    c = complete(server, seed=78, **body)
    assert a["tokens"] == b["tokens"]
    assert a["tokens"] != c["tokens"]


def test_draws_follow_the_reported_distribution(server):
    """400 independent first tokens of the same prompt: their frequencies
    match the post-sampling distribution the server reports for them."""
    n = 400
    res = complete(server, prompt=["The engine"] * n, n_predict=1, temperature=1.3, top_k=5,
                   top_p=1.0, min_p=0.0, n_probs=5, post_sampling_probs=True)
    reports = [r["completion_probabilities"][0] for r in res]
    dist = {t["id"]: t["prob"] for t in reports[0]["top_probs"]}
    assert len(dist) == 5 and abs(sum(dist.values()) - 1.0) < 1e-4
    assert all({t["id"]: t["prob"] for t in r["top_probs"]} == dist for r in reports)
    counts = {}
    for r in reports:
        counts[r["id"]] = counts.get(r["id"], 0) + 1
        assert r["prob"] == dist[r["id"]]
    for tok, p in dist.items():
        freq = counts.get(tok, 0) / n
        assert abs(freq - p) <= 4 * math.sqrt(p * (1 - p) / n) + 0.01, (tok, freq, p)


def test_mirostat_with_a_tiny_target_is_greedy(server, tiny_facts):
    body = dict(prompt=tiny_facts["long_prompt"], n_predict=16, ignore_eos=True,
                return_tokens=True)
    miro = complete(server, temperature=1.0, mirostat=2, mirostat_tau=0.01, seed=5, **body)
    hot = complete(server, temperature=1.0, seed=5, top_k=0, top_p=1.0, min_p=0.0, **body)
    greedy = complete(server, temperature=0, **body)
    assert miro["tokens"] == greedy["tokens"] != hot["tokens"]
    assert miro["generation_settings"]["mirostat"] == 2


def test_xtc_that_always_fires_draws_the_runner_up(server, tiny_facts):
    res = complete(server, prompt=tiny_facts["long_prompt"], n_predict=8, ignore_eos=True,
                   temperature=1.0, top_k=2, top_p=1.0, min_p=0.0, xtc_probability=1.0,
                   xtc_threshold=0.0, n_probs=2)
    for entry in res["completion_probabilities"]:
        assert entry["id"] == entry["top_logprobs"][1]["id"]


def test_presence_penalty_pushes_back_a_forced_token(server, tiny_facts):
    body = dict(prompt="x", n_predict=12, temperature=0, ignore_eos=True, return_tokens=True,
                logit_bias=[[300, 40]])
    forced = complete(server, **body)
    assert set(forced["tokens"]) == {300}
    penalized = complete(server, **body, presence_penalty=1000.0, repeat_last_n=2)
    # 300 is banned while it sits in the last two tokens, then comes back
    assert penalized["tokens"][0::3] == [300] * 4 and 300 not in penalized["tokens"][1::3]


def test_logit_bias_shapes(server, tiny_model):
    from mlxcel_trio.engine.vocab import Vocab
    vocab = Vocab(tiny_model)
    word = " the"
    ids = vocab.tokenize(word, add_special=False, parse_special=False)
    base = dict(prompt="x", n_predict=24, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0,
                seed=3, return_tokens=True, ignore_eos=True)
    forced = complete(server, **{**base, "logit_bias": {str(ids[0]): 100}})
    assert set(forced["tokens"]) == {ids[0]}
    by_text = complete(server, **{**base, "logit_bias": [[word, 100]]})
    assert set(by_text["tokens"]) <= set(ids)
    banned = complete(server, **{**base, "logit_bias": {word: False}})
    assert not set(banned["tokens"]) & set(ids)
    gs = by_text["generation_settings"]["logit_bias"]
    assert gs[0] == {"bias": 100.0, "token": ids[0]}
    # ignore_eos appends a ban for each end-of-generation token: null is -inf
    assert {"bias": None, "token": 1538} in gs and {"bias": None, "token": 1536} in gs
    skipped = complete(server, **{**base, "n_predict": 1, "logit_bias": [[1, 2, 3], ["x"], 5,
                                                                         [99999, 1.0]]})
    assert skipped["generation_settings"]["logit_bias"] == [
        {"bias": None, "token": 1536}, {"bias": None, "token": 1538}]


def test_generation_settings_report_what_was_resolved(server):
    body = {**FULL_CHAIN, "mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.2,
            "adaptive_target": 0.25, "adaptive_decay": 0.5, "n_probs": 3,
            "post_sampling_probs": True, "dry_sequence_breakers": ["\n", "END"],
            "samplers": "edskypmxta", "seed": 11}
    gs = complete(server, prompt="x", n_predict=1, **body)["generation_settings"]
    for key, value in body.items():
        if key in ("samplers", "dry_sequence_breakers"):
            continue
        assert gs[key] == pytest.approx(value, rel=1e-6), key
    assert gs["dry_sequence_breakers"] == ["\n", "END"]
    assert gs["samplers"][-1] == "adaptive_p" and len(gs["samplers"]) == 10
    assert gs["xtc_threshold"] == 0.10000000149011612  # a C++ float, as upstream prints it
    # below 1.0, dry_base falls back to the server's value
    low = complete(server, prompt="x", n_predict=1, dry_base=0.5)["generation_settings"]
    assert low["dry_base"] == 1.75


def test_probability_reports(server, tiny_facts):
    body = dict(prompt=tiny_facts["long_prompt"], n_predict=6, temperature=0.8, seed=2,
                ignore_eos=True, n_probs=4)
    pre = complete(server, **body)["completion_probabilities"]
    assert len(pre) == 6
    for e in pre:
        assert list(e) == ["id", "token", "bytes", "logprob", "top_logprobs"]
        lps = [t["logprob"] for t in e["top_logprobs"]]
        assert len(lps) == 4 and lps == sorted(lps, reverse=True) and lps[0] < 0
        assert list(e["top_logprobs"][0]) == ["id", "token", "bytes", "logprob"]
        assert bytes(e["bytes"]).decode("utf-8", "replace").startswith(e["token"])
    post_ = complete(server, **body, post_sampling_probs=True)["completion_probabilities"]
    assert [e["id"] for e in post_] == [e["id"] for e in pre]  # same seed, same draws
    for e in post_:
        assert list(e) == ["id", "token", "bytes", "prob", "top_probs"]
        assert 0 < e["prob"] <= 1 and all(t["prob"] > 0 for t in e["top_probs"])
    # the alias, and the OpenAI route's logprobs.content
    alias = complete(server, **{**body, "n_probs": None, "logprobs": 2})
    assert len(alias["completion_probabilities"][0]["top_logprobs"]) == 2
    v1 = post(server.url, {**body, "n_probs": None, "logprobs": 2}, path="/v1/completions").json()
    assert v1["choices"][0]["logprobs"]["content"] == alias["completion_probabilities"]
    none = complete(server, prompt="x", n_predict=2)
    assert "completion_probabilities" not in none


def test_probability_reports_stream_one_entry_per_frame(server, tiny_facts):
    frames, _ = stream_frames(server.url, dict(prompt=tiny_facts["long_prompt"], n_predict=5,
                                               temperature=0, ignore_eos=True, n_probs=3))
    partial, final = frames[:-1], frames[-1]
    assert all(len(f["completion_probabilities"]) == 1 for f in partial)
    assert "completion_probabilities" not in final
    for f in partial:
        (e,) = f["completion_probabilities"]
        assert e["id"] == f["tokens"][0] == e["top_logprobs"][0]["id"]  # greedy: the best


def test_a_stop_word_s_tokens_leave_the_report(server, tiny_facts):
    base = complete(server, prompt=tiny_facts["long_prompt"], n_predict=12, temperature=0,
                    ignore_eos=True, n_probs=1)
    text = base["content"]
    stop = text[len(text) // 2:len(text) // 2 + 3]
    res = complete(server, prompt=tiny_facts["long_prompt"], n_predict=12, temperature=0,
                   ignore_eos=True, n_probs=1, stop=[stop])
    assert res["stop_type"] == "word"
    assert len(res["completion_probabilities"]) < res["tokens_predicted"]


@pytest.mark.parametrize(("body", "message"), [
    ({"samplers": ["top_k", "temperature"]}, "Field 'samplers': sampler order top_k;temperature"),
    ({"samplers": "kt"}, "Field 'samplers': sampler order top_k;temperature"),
    ({"samplers": [1]}, "Field 'samplers': [json.exception.type_error.302] type must be string"),
    ({"dry_sequence_breakers": []}, "Field 'dry_sequence_breakers': Error: dry_sequence_breakers"
                                    " must be a non-empty array of strings"),
    ({"dry_sequence_breakers": "x"}, "must be a non-empty array of strings"),
    ({"repeat_penalty": 0}, "penalty_repeat must be finite and greater than 0"),
    ({"adaptive_decay": 0.995}, "Field 'adaptive_decay': Value must be between 0.000000 <= "
                                "value <= 0.990000, but got 0.995000"),
    ({"min_keep": -1}, "Field 'min_keep': Value must be between"),
    ({"repeat_last_n": -1}, "Field 'repeat_last_n': Value must be between"),
])
def test_request_errors_use_upstream_wording(server, body, message):
    assert message in error(server, prompt="x", n_predict=1, **body)


def test_tolerated_values(server):
    """What upstream accepts quietly: unknown sampler names are dropped,
    a non-array samplers value is ignored, soft limits clamp."""
    names = ["penalties", "DRY", "top-n-sigma", "topk", "typ", "nucleus", "min_p", "xtc",
             "temp", "bogus"]
    gs = complete(server, prompt="x", n_predict=1, samplers=names)["generation_settings"]
    assert gs["samplers"] == ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p",
                              "min_p", "xtc", "temperature"]
    gs = complete(server, prompt="x", n_predict=1, samplers={"a": 1}, mirostat=7,
                  xtc_threshold=3.0, adaptive_decay=0.99)["generation_settings"]
    assert gs["mirostat"] == 2 and gs["xtc_threshold"] == 1.0
    assert gs["adaptive_decay"] == pytest.approx(0.99)


def test_backend_sampling_is_accepted_and_not_reported(server):
    a = complete(server, prompt="x", n_predict=4, temperature=0, backend_sampling=True)
    b = complete(server, prompt="x", n_predict=4, temperature=0)
    assert a["content"] == b["content"]
    assert "backend_sampling" not in a["generation_settings"]
    assert "Field 'backend_sampling'" in error(server, prompt="x", backend_sampling=1)

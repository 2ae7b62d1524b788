"""Speculative decoding on a real server: a drafting server answers every
greedy request with the plain server's exact tokens, concurrent requests
keep batching, and the draft counts surface in timings, /slots,
generation_settings and /metrics; a draft checkpoint with another
vocabulary is refused before anything loads."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading

import httpx
import pytest

from .sse import post

pytestmark = pytest.mark.e2e

GREEDY = {"temperature": 0.0, "seed": 1, "ignore_eos": True, "return_tokens": True}
PROMPTS = ["one two three one two three one two", "the cat sat on the mat and the cat",
           "alpha beta gamma delta", "speculation keeps every token"]


@pytest.fixture(scope="module")
def ngram_server(tiny_model, start_server):
    srv = start_server(tiny_model, "-np", "4", "-c", "2048", "--metrics",
                       "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "2",
                       "--spec-ngram-simple-size-m", "8")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def draft_server(tiny_model, tiny_draft_model, start_server):
    srv = start_server(tiny_model, "-np", "4", "-c", "2048", "-md", str(tiny_draft_model),
                       "--spec-draft-n-max", "4")
    yield srv
    srv.stop()


def _tokens(srv, prompt: str, n: int = 40) -> dict:
    return post(srv.url, {"prompt": prompt, "n_predict": n, **GREEDY}).json()


def _concurrently(srv) -> dict[int, dict]:
    out: dict[int, dict] = {}

    def one(i: int) -> None:
        out[i] = _tokens(srv, PROMPTS[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


@pytest.mark.parametrize("which", ["ngram_server", "draft_server"])
def test_greedy_tokens_match_the_plain_server(which, request, server):
    spec = request.getfixturevalue(which)
    plain = {i: _tokens(server, p) for i, p in enumerate(PROMPTS)}
    got = _concurrently(spec)
    assert {i: r["tokens"] for i, r in got.items()} == {i: r["tokens"] for i, r in plain.items()}
    timings = [r["timings"] for r in got.values()]
    drafted = [t for t in timings if "draft_n" in t]
    assert drafted, timings                       # at least one request drafted
    assert all(0 <= t["draft_n_accepted"] <= t["draft_n"] for t in drafted)
    assert all("draft_n" not in r["timings"] for r in plain.values())


def test_reporting_names_the_types_and_counts(ngram_server, draft_server):
    res = _tokens(ngram_server, PROMPTS[0])
    assert res["generation_settings"]["speculative.types"] == "ngram-simple"
    res = _tokens(draft_server, PROMPTS[1])
    assert res["generation_settings"]["speculative.types"] == "draft-simple"
    slots = httpx.get(f"{draft_server.url}/slots", timeout=30).json()
    assert all(s["speculative"] is True for s in slots)
    assert slots[0]["params"]["speculative.types"] == "draft-simple"
    metrics = httpx.get(f"{ngram_server.url}/metrics", timeout=30).text
    values = {ln.split()[0]: float(ln.split()[1]) for ln in metrics.splitlines()
              if ln.startswith("llamacpp:spec_decode")}
    assert values["llamacpp:spec_decode_num_draft_tokens_total"] > 0
    assert values["llamacpp:spec_decode_num_drafts_total"] > 0
    assert 0 <= values["llamacpp:spec_decode_num_accepted_tokens_total"] \
        <= values["llamacpp:spec_decode_num_draft_tokens_total"]


def test_a_draft_with_another_vocabulary_is_refused_before_loading(tiny_model,
                                                                   tiny_draft_model, tmp_path):
    other = tmp_path / "other-draft"
    shutil.copytree(tiny_draft_model, other)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    word = next(w for w, i in vocab.items() if i == 100)
    vocab["zz-not-the-target"] = vocab.pop(word)
    (other / "tokenizer.json").write_text(json.dumps(tok))
    proc = subprocess.run(
        [sys.executable, "-m", "mlxcel_trio", "-m", str(tiny_model), "-md", str(other),
         "--spec-type", "draft-eagle3", "--port", "0"], check=False, capture_output=True,
        text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    # every problem of the command line in one run
    assert any("draft-eagle3 needs an EAGLE-3 draft head" in e for e in errors), errors
    assert "listening" not in proc.stdout and "Traceback" not in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "mlxcel_trio", "-m", str(tiny_model), "-md", str(other),
         "--port", "0"], check=False, capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL)
    assert proc.returncode == 1, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert "draft model vocab must match target model to use speculation" in line
    assert "token 100" in line and "loaded" not in proc.stderr


def test_grammar_and_probability_rows_decode_beside_drafting_rows(draft_server, server):
    """A constrained row and an n_probs row share the drafting batch; they
    decode one token per step and give the plain server's answer."""
    gbnf = 'root ::= item ("," item){0,3} "."\nitem ::= [a-z]{1,6} | [0-9]{1,3}'
    special = [{"prompt": "x y z", "n_predict": 40, "grammar": gbnf, **GREEDY},
               {"prompt": "a b c", "n_predict": 12, "n_probs": 3, **GREEDY}]
    out: dict[int, dict] = {}

    def one(i: int) -> None:
        body = special[i] if i < 2 else {"prompt": PROMPTS[i], "n_predict": 40, **GREEDY}
        out[i] = post(draft_server.url, body).json()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i in range(2):
        ref = post(server.url, special[i]).json()
        assert out[i]["tokens"] == ref["tokens"], i
        assert "draft_n" not in out[i]["timings"]
    got, want = out[1]["completion_probabilities"], ref["completion_probabilities"]
    assert [[t["id"] for t in g["top_logprobs"]] for g in got] == \
        [[t["id"] for t in w["top_logprobs"]] for w in want]
    assert all(abs(g["logprob"] - w["logprob"]) < 1e-3 for g, w in zip(got, want))
    assert any("draft_n" in out[i]["timings"] for i in (2, 3))


def test_the_load_summary_names_the_speculative_kv_and_blas_choices(ngram_server, draft_server,
                                                                    tiny_draft_model):
    line = ngram_server.wait_for_text("main: choices: ")
    assert "speculative ngram-simple (draft 0..3 tokens)" in line, line
    assert "LoRA none" in line and "KV cache K f16, V f16" in line and "| BLAS " in line
    line = draft_server.wait_for_text("main: choices: ")
    assert (f"speculative draft-simple (draft 0..4 tokens, draft model "
            f"{tiny_draft_model.name})") in line, line

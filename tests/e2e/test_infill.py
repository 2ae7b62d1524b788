"""POST /infill: llama-server's fill-in-the-middle prompt over the native route."""

from __future__ import annotations

import shutil

import httpx
import pytest

pytestmark = pytest.mark.e2e

GREEDY = {"temperature": 0, "ignore_eos": True}


def infill(url: str, **body) -> httpx.Response:
    return httpx.post(url + "/infill", json=body, timeout=60)


def test_prompt_layout_and_native_shape(server):
    res = infill(server.url, input_prefix="def f(x):\n    ", input_suffix="\n    return y\n",
                 input_extra=[{"filename": "a.py", "text": "import os\n"}], prompt="z = ",
                 n_predict=6, **GREEDY).json()
    # extra context only fills what the slot holds beyond one batch (1024 - 2048 < 0)
    assert res["prompt"] == ("<|fim_prefix|>def f(x):\n    z = "
                             "<|fim_suffix|>\n    return y\n<|fim_middle|>")
    assert res["tokens_predicted"] == 6 and res["stop_type"] == "limit"
    assert "generation_settings" in res and res["index"] == 0


def test_markers_inside_the_text_stay_literal(server):
    """Fields are tokenized with special-token parsing off, as upstream."""
    plain = infill(server.url, input_prefix="a", input_suffix="b", n_predict=1).json()
    marked = infill(server.url, input_prefix="a<|fim_middle|>", input_suffix="b",
                    n_predict=1).json()
    marker_as_text = httpx.post(server.url + "/tokenize",
                                json={"content": "<|fim_middle|>", "parse_special": False}).json()
    assert marked["tokens_evaluated"] == plain["tokens_evaluated"] + len(marker_as_text["tokens"])
    assert len(marker_as_text["tokens"]) > 1


def test_missing_fields_answer_like_upstream(server):
    # upstream means this 400 but falls through to a 500 out_of_range; we
    # answer the 400 (issue #7, recorded on POST /infill in the manifest)
    r = infill(server.url, input_suffix="x")
    assert r.status_code == 400
    assert r.json()["error"] == {"code": 400, "type": "invalid_request_error",
                                 "message": '"input_prefix" is required'}
    r = infill(server.url, input_prefix="x")
    assert r.status_code == 400 and r.json()["error"]["message"] == '"input_suffix" is required'
    r = infill(server.url, input_prefix="x", input_suffix="y", input_extra=[{"text": 5}])
    assert r.status_code == 400
    assert r.json()["error"]["message"] == \
        'extra_context chunk must contain a "text" field with a string value'
    r = infill(server.url, input_prefix="x", input_suffix="y", input_extra={"text": "a"})
    assert r.json()["error"]["message"] == \
        '"input_extra" must be an array of {"filename": string, "text": string}'


def test_spm_infill_and_batch_truncation(tiny_model, start_server):
    srv = start_server(tiny_model, "-np", "1", "-b", "16", "--spm-infill")
    prefix = " ".join(f"p{i}" for i in range(40))
    suffix = " ".join(f"s{i}" for i in range(40))
    res = infill(srv.url, input_prefix=prefix, input_suffix=suffix, n_predict=1,
                 input_extra=[{"filename": "a.py", "text": "import os\n"}]).json()
    tok = lambda s: httpx.post(srv.url + "/tokenize", json={"content": s}).json()["tokens"]  # noqa: E731
    pre, suf = tok(prefix), tok(suffix)
    detok = lambda ids: httpx.post(srv.url + "/detokenize", json={"tokens": ids}).json()["content"]  # noqa: E731
    # the vocabulary has no FIM_REP / FIM_SEP: a chunk gets the snippet separator;
    # suffix block first; prefix keeps its last 3*(16/4) tokens, suffix its first 16/4 - 2
    assert res["prompt"] == ("\n\n--- snippet ---\n\nimport os\n<|fim_suffix|>" + detok(suf[:2])
                             + "<|fim_prefix|>" + detok(pre[-12:]) + "<|fim_middle|>")
    srv.stop()


def test_model_without_fim_tokens_is_refused(tiny_model, start_server, tmp_path):
    ckpt = tmp_path / "no-fim"
    shutil.copytree(tiny_model, ckpt)
    tok = ckpt / "tokenizer.json"
    text = tok.read_text()
    for role in ("prefix", "suffix", "middle"):
        text = text.replace(f"<|fim_{role}|>", f"<|xfim_{role}|>")
    tok.write_text(text)
    srv = start_server(ckpt, "-np", "1")
    r = infill(srv.url, input_prefix="a", input_suffix="b")
    assert r.status_code == 501
    assert r.json()["error"] == {
        "code": 501, "type": "not_supported_error",
        "message": "Infill is not supported by this model: prefix token is missing. "
                   "suffix token is missing. middle token is missing. "}
    srv.stop()

"""GET /health, /props, /models, /v1/models, /slots, and the 404 surface.

Shapes follow ../shared/upstream/llama-server/response_shapes.md; the tests
that read that file skip when it is absent.
"""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest

from tests.conftest import SHARED

from .sse import post

pytestmark = pytest.mark.e2e

SHAPES = SHARED / "upstream" / "llama-server" / "response_shapes.md"
NOT_FOUND = '{"error":{"message":"File Not Found","type":"not_found_error","code":404}}'
REDUCED_DROPS = {"dry_sequence_breakers", "stop", "logit_bias", "grammar", "grammar_lazy",
                 "grammar_triggers", "preserved_tokens"}
MODEL_KEYS = ["id", "aliases", "tags", "object", "created", "owned_by", "meta"]
META_KEYS = ["vocab_type", "n_vocab", "n_ctx", "n_ctx_train", "n_embd", "n_params", "size", "ftype"]


def get(server, path: str) -> httpx.Response:
    return httpx.get(server.url + path, timeout=30)


def get_json(server, path: str):
    r = get(server, path)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json; charset=utf-8"
    return r.json()


@pytest.mark.parametrize("path", ["/health", "/v1/health"])
def test_health(server, path):
    r = get(server, path)
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


def test_props(server, tiny_model, tiny_facts):
    props = get_json(server, "/props")
    dgs = props["default_generation_settings"]
    assert list(dgs) == ["params", "n_ctx"]
    assert dgs["n_ctx"] == 1024  # per slot: -c 4096 over -np 4
    assert props["total_slots"] == 4
    params = dgs["params"]
    assert not REDUCED_DROPS & set(params)
    # the reduced form keeps the rest of the final response's generation_settings
    full = post(server.url, {"prompt": "x", "n_predict": 1})
    assert full.status_code == 200, full.text
    full_keys = list(full.json()["generation_settings"])
    assert list(params) == [k for k in full_keys if k not in REDUCED_DROPS]
    # server defaults: the checkpoint's generation_config.json sampling values
    gen = json.loads((tiny_model / "generation_config.json").read_text())
    assert params["top_k"] == gen.get("top_k", 40) and params["n_predict"] == -1
    assert abs(params["temperature"] - gen.get("temperature", 0.8)) < 1e-6
    assert props["model_path"] == str(tiny_model)
    assert props["chat_template"] == (tiny_model / "chat_template.jinja").read_text()
    assert props["chat_template"].strip()
    assert props["bos_token"] == ""  # the fixture declares no BOS
    assert props["eos_token"] == "<|im_end|>"
    assert isinstance(props["build_info"], str) and props["build_info"]
    assert props["is_sleeping"] is False


def test_props_key_order_matches_upstream_where_present(server):
    if not SHAPES.is_file():
        pytest.skip("shared/upstream reference data absent")
    section = SHAPES.read_text().split("## GET /props", 1)[1].split("Router mode", 1)[0]
    upstream = re.findall(r"`([a-z_]+)`", section)
    keys = list(get_json(server, "/props"))
    served = [k for k in upstream if k in keys]
    assert served == [k for k in keys if k in upstream]
    for key in ("default_generation_settings", "total_slots", "model_path", "chat_template",
                "bos_token", "eos_token", "build_info"):
        assert key in upstream and key in keys


@pytest.mark.parametrize("path", ["/models", "/v1/models"])
def test_models_single_model_shape(server, tiny_model, tiny_facts, path):
    res = get_json(server, path)
    assert res["object"] == "list"
    assert len(res["data"]) == 1 and len(res["models"]) == 1
    model = res["data"][0]
    assert list(model) == MODEL_KEYS
    assert model["object"] == "model" and model["owned_by"] == "llamacpp"
    assert model["id"] == str(tiny_model)  # no alias: the -m value as given, as upstream
    assert model["aliases"] == [model["id"]] and model["tags"] == []  # the name, as upstream
    assert isinstance(model["created"], int) and model["created"] > 0
    meta = model["meta"]
    assert list(meta) == META_KEYS
    config = json.loads((tiny_model / "config.json").read_text())
    assert meta["n_vocab"] == tiny_facts["vocab_size"]
    assert meta["n_embd"] == config["hidden_size"]
    assert meta["n_ctx_train"] == config["max_position_embeddings"]
    assert meta["n_ctx"] == 4096  # the whole context, -c 4096
    assert meta["n_params"] > 0 and meta["size"] > 0
    legacy = res["models"][0]
    assert legacy["name"] == legacy["model"] == model["id"]
    assert legacy["details"]["format"] == "safetensors"
    assert legacy["capabilities"] == ["completion"]


def test_models_via_the_openai_sdk(server, tiny_model):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as client:
        models = list(client.models.list())
    assert [m.id for m in models] == [str(tiny_model)]
    assert models[0].owned_by == "llamacpp" and models[0].object == "model"


def test_alias_is_the_served_model_name(tiny_model, start_server):
    # upstream keeps aliases in a std::set: the first in sort order is served
    srv = start_server(tiny_model, "-c", "512", "-np", "1", "-a", "zebra,apple")
    try:
        res = httpx.get(srv.url + "/v1/models", timeout=30).json()
        assert res["data"][0]["id"] == "apple"
        assert res["data"][0]["aliases"] == ["apple", "zebra"]
        assert res["models"][0]["name"] == "apple"
        done = post(srv.url, {"prompt": "x", "n_predict": 1})
        assert done.json()["model"] == "apple"
        assert httpx.get(srv.url + "/props", timeout=30).json()["model_alias"] == "apple"
    finally:
        srv.stop()


def test_slots(server):
    slots = get_json(server, "/slots")
    assert [s["id"] for s in slots] == [0, 1, 2, 3]
    for s in slots:
        assert list(s)[:4] == ["id", "n_ctx", "speculative", "is_processing"]
        assert s["n_ctx"] == 1024
        assert isinstance(s["is_processing"], bool)


@pytest.mark.parametrize("method,path", [
    ("GET", "/nope"),
    ("POST", "/v1/chat/nothing"),
    ("GET", "/completion"),
    ("GET", "/v1/completions"),
    ("PUT", "/health"),
    ("DELETE", "/props"),
    ("POST", "/health"),
    ("POST", "/slots"),
])
def test_not_found(server, method, path):
    r = httpx.request(method, server.url + path, timeout=30)
    assert r.status_code == 404
    assert r.text == NOT_FOUND
    assert r.headers["server"] == "llama.cpp"


@pytest.mark.parametrize("method,path", [
    ("GET", "/health"), ("GET", "/props"), ("GET", "/v1/models"), ("GET", "/slots"),
    ("POST", "/tokenize"), ("GET", "/nope"),
])
def test_server_header_on_every_response(server, method, path):
    r = httpx.request(method, server.url + path, timeout=30,
                      **({"json": {"content": "x"}} if method == "POST" else {}))
    assert r.headers["server"] == "llama.cpp"


def test_server_header_on_errors_and_streams(server):
    r = post(server.url, {"prompt": "x", "n_predict": -5})
    assert r.status_code == 400 and r.headers["server"] == "llama.cpp"
    with httpx.stream("POST", server.url + "/completion", timeout=30,
                      json={"prompt": "x", "n_predict": 2, "stream": True}) as s:
        assert s.headers["server"] == "llama.cpp"
        s.read()

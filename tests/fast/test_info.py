"""GET /health, /props, /models, /slots, /metrics and POST /props, in-process
(server/surfaces/info.py, server/surfaces/metrics.py), and the gate in
front of them (server/app.py)."""

from __future__ import annotations

import pytest
import trio

from mlxcel_trio.protocol.records import Job, Started
from mlxcel_trio.server.request.settings import REDUCED_DROPS

from .conftest import JSON_TYPE, MODEL_NAME, each_route, error_of
from .fake_engine import reply

route = pytest.mark.route
WAIT_S = 10.0

PROPS_KEYS = ["default_generation_settings", "total_slots", "model_alias", "model_ftype",
              "model_path", "modalities", "media_marker", "endpoint_slots", "endpoint_props",
              "endpoint_metrics", "ui", "ui_settings", "chat_template", "chat_template_caps",
              "bos_token", "eos_token", "build_info", "is_sleeping", "cors_proxy_enabled",
              "prompt_cache", "geometry", "sleep_idle_seconds", "capabilities"]
MODEL_KEYS = ["id", "aliases", "tags", "object", "created", "owned_by", "meta"]
META_KEYS = ["vocab_type", "n_vocab", "n_ctx", "n_ctx_train", "n_embd", "n_params", "size",
             "ftype"]
LOADING = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}


@each_route("GET /health", "GET /v1/health")
async def test_health(serve, path):
    s = await serve()
    r = await s.get(path)
    assert r.status_code == 200 and r.content_type == JSON_TYPE
    assert await r.get_json() == {"status": "ok"}
    assert r.headers["Server"] == "llama.cpp"


@route("GET /health", "GET /props")
async def test_everything_answers_503_until_the_engine_has_loaded(serve):
    s = await serve(load_error="never loads", wait_loaded=False)
    for path in ("/health", "/props"):
        r = await s.get(path)
        assert r.status_code == 503 and await r.get_json() == LOADING


@route("GET /props")
async def test_props_shape(serve, vocab):
    s = await serve("-c", "2048", "-np", "2")
    r = await s.get("/props")
    assert r.status_code == 200 and r.content_type == JSON_TYPE
    props = await r.get_json()
    assert list(props) == PROPS_KEYS
    assert props["total_slots"] == 2 and props["model_alias"] == MODEL_NAME
    assert props["default_generation_settings"]["n_ctx"] == 1024
    params = props["default_generation_settings"]["params"]
    assert not set(REDUCED_DROPS) & set(params) and params["n_predict"] == -1
    assert props["eos_token"] == vocab.eos_token and props["bos_token"] == ""
    assert props["chat_template"] == vocab.chat_template
    assert props["is_sleeping"] is False and props["model_ftype"] == "all F32"


@route("POST /props")
async def test_setting_props_needs_the_flag(serve):
    s = await serve()
    r = await s.post("/props", {})
    assert error_of(await r.get_json(), 501, "not_supported_error") == (
        "This server does not support changing global properties. Start it with `--props`")
    s = await serve("--props")
    r = await s.post("/props", {"anything": 1})
    assert r.status_code == 200 and await r.get_json() == {"success": True}


@each_route("GET /models", "GET /v1/models")
async def test_models_shape(serve, vocab, path):
    s = await serve("-c", "4096", "-a", "zebra,apple")
    r = await s.get(path)
    assert r.status_code == 200 and r.content_type == JSON_TYPE
    res = await r.get_json()
    assert set(res) == {"models", "object", "data"} and res["object"] == "list"
    (model,) = res["data"]
    assert list(model) == MODEL_KEYS and list(model["meta"]) == META_KEYS
    assert model["aliases"] == ["apple", "zebra"] and model["owned_by"] == "llamacpp"
    assert model["meta"]["n_ctx"] == 4096 and model["meta"]["n_vocab"] == vocab.n_vocab
    assert res["models"][0]["details"]["format"] == "safetensors"


@route("GET /v1/models")
async def test_without_an_alias_the_models_name_is_its_alias(serve):
    s = await serve()
    (model,) = (await (await s.get("/v1/models")).get_json())["data"]
    assert model["aliases"] == [model["id"]]


@route("GET /slots", "POST /completion")
async def test_slots_shape_before_and_after_a_job(serve):
    s = await serve("-c", "1024", "-np", "2")
    r = await s.get("/slots")
    assert r.status_code == 200 and r.content_type == JSON_TYPE
    idle = await r.get_json()
    assert idle == [{"id": i, "n_ctx": 512, "speculative": False, "is_processing": False}
                    for i in range(2)]
    done = await s.post("/completion", {"prompt": "hi", "n_predict": 3})
    assert done.status_code == 200
    first = (await (await s.get("/slots")).get_json())[0]
    assert set(first) == {"id", "n_ctx", "speculative", "is_processing", "id_task",
                          "n_prompt_tokens", "n_prompt_tokens_processed",
                          "n_prompt_tokens_cache", "params", "next_token"}
    # the idle slot keeps its last task, but its counters are reset on release
    # as upstream's (a finished budget does not linger as n_remain 0)
    assert first["next_token"] == [{"has_next_token": False, "has_new_line": False,
                                    "n_remain": -1, "n_decoded": 0}]
    assert (first["n_prompt_tokens_processed"], first["n_prompt_tokens_cache"]) == (0, 0)


@route("GET /slots")
async def test_slots_disabled_and_fail_on_no_slot(serve):
    s = await serve("--no-slots")
    r = await s.get("/slots")
    assert error_of(await r.get_json(), 501, "not_supported_error") == (
        "This server does not support slots endpoint. Start it with `--slots`")
    s = await serve("-np", "1", script=reply(hold_after=1))
    held = s.bridge.open(Job(s.bridge.next_job_id(), (1, 2), n_predict=-1))
    try:
        with trio.fail_after(WAIT_S):
            assert isinstance(await held.events.receive(), Started)  # the slot is taken
        r = await s.get("/slots?fail_on_no_slot=1")
        assert error_of(await r.get_json(), 503, "unavailable_error") == "no slot available"
    finally:
        held.close()


@route("GET /metrics", "POST /completion")
async def test_metrics(serve):
    s = await serve()
    r = await s.get("/metrics")
    assert error_of(await r.get_json(), 501, "not_supported_error") == (
        "This server does not support metrics endpoint. Start it with `--metrics`")
    s = await serve("--metrics")
    assert (await s.post("/completion", {"prompt": "hi", "n_predict": 2})).status_code == 200
    r = await s.get("/metrics")
    assert r.status_code == 200 and r.content_type.startswith("text/plain")
    assert "Process-Start-Time-Unix" in r.headers
    text = (await r.get_data()).decode()
    assert "llamacpp:tokens_predicted_total 2" in text
    assert "# TYPE llamacpp:requests_processing gauge" in text

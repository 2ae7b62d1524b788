"""The feature stubs, the Vertex AI routes (AIP_MODE=PREDICTION), and the
HTTP layer every route sits behind: 404s, the API key, CORS preflight."""

from __future__ import annotations

import pytest

from mlxcel_trio.protocol.routes import ROUTES

from .conftest import JSON_TYPE, each_route, error_of

route = pytest.mark.route
NOT_FOUND = {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}
VERTEX_ENV = {"AIP_MODE": "PREDICTION", "AIP_HEALTH_ROUTE": "/ping",
              "AIP_PREDICT_ROUTE": "/vertex/predict"}
KEY = "sekrit"


def _specs(handler: str) -> list[str]:
    return [f"{r.method} {r.path}" for r in ROUTES if r.handler == handler]


@pytest.mark.parametrize("spec,what,flag", [
    pytest.param(spec, what, flag, marks=route(spec), id=spec)
    for handler, what, flag in (("embeddings", "embeddings", "--embeddings"),
                                ("v1_embeddings", "embeddings", "--embeddings"),
                                ("rerank", "reranking", "--reranking"))
    for spec in _specs(handler)])
async def test_features_this_server_runs_without(serve, spec, what, flag):
    s = await serve()
    method, path = spec.split(" ", 1)
    r = await s.open(path, method=method, json={"input": "x"})
    assert r.content_type == JSON_TYPE
    assert error_of(await r.get_json(), 501, "not_supported_error") == (
        f"This server does not support {what}. Start it with `{flag}`")


@pytest.mark.parametrize("spec", [pytest.param(spec, marks=route(spec), id=spec)
                                  for spec in _specs("feature_disabled")])
async def test_disabled_features_are_upstreams_403(serve, spec):
    s = await serve()
    method, path = spec.split(" ", 1)
    r = await s.open(path, method=method)
    assert r.status_code == 403 and r.content_type == JSON_TYPE
    assert await r.get_json() == {"error": {"message": "this feature is disabled",
                                            "type": "feature_disabled"}}


@route("GET /lora-adapters", "POST /lora-adapters")
async def test_lora_adapters_without_adapters(serve):
    s = await serve()
    r = await s.get("/lora-adapters")
    assert r.status_code == 200 and r.content_type == JSON_TYPE and await r.get_json() == []
    r = await s.post("/lora-adapters", [])
    assert r.status_code == 200 and await r.get_json() == {"success": True}
    r = await s.post("/lora-adapters", [{"id": 0, "scale": 0.5}, {"nonsense": 1}])
    assert error_of(await r.get_json(), 400, "invalid_request_error").startswith(
        "invalid adapter id 0")
    r = await s.post("/lora-adapters", {"id": 0, "scale": 0.5})
    assert error_of(await r.get_json(), 400, "invalid_request_error") == (
        "Request body must be an array")


@pytest.mark.parametrize("spec", [pytest.param(spec, marks=route(spec), id=spec)
                                  for spec in _specs("transcriptions")])
async def test_transcriptions_answer_a_text_only_models_501(serve, spec):
    s = await serve()
    method, path = spec.split(" ", 1)
    r = await s.open(path, method=method, data=b"--x\r\nnot a form")
    assert r.content_type == JSON_TYPE
    assert error_of(await r.get_json(), 501, "not_supported_error") == (
        "The current model does not support audio input.")


# -- Vertex AI -----------------------------------------------------------------------------

@route("GET $AIP_HEALTH_ROUTE")
async def test_vertex_health_alias(serve):
    s = await serve(env=VERTEX_ENV)
    r = await s.get("/ping")
    assert r.status_code == 200 and await r.get_json() == {"status": "ok"}


@route("POST $AIP_PREDICT_ROUTE")
async def test_vertex_predict_fans_out_in_order(serve):
    s = await serve(env=VERTEX_ENV)
    r = await s.post("/vertex/predict", {"instances": [
        {"@requestFormat": "/completion", "prompt": "x", "n_predict": 2, "stream": True},
        {"@requestFormat": "tokenize", "content": "hello"},
        "not an object",
        {"@requestFormat": "noSuchRoute"},
        {"@requestFormat": "health"},
    ]})
    assert r.status_code == 200 and r.content_type == JSON_TYPE
    p = (await r.get_json())["predictions"]
    assert p[0]["tokens_predicted"] == 2, "stream is forced off: one final result"
    assert p[1]["tokens"]
    bad = {"code": 400, "type": "invalid_request_error"}
    assert p[2] == {"error": {**bad, "message": "each instance must be a JSON object"}}
    assert p[3] == {"error": {**bad, "message": "no handler registered for @requestFormat: "
                                                "noSuchRoute"}}
    assert p[4] == {"status": "ok"}


@route("POST $AIP_PREDICT_ROUTE")
@pytest.mark.parametrize("body,message", [
    ([1, 2], "request body must be a JSON object"),
    ({"instances": {}}, "request body must include an array field named instances"),
    ({"instances": [{}] * 129}, "instances array exceeds maximum size of 128"),
])
async def test_vertex_bad_bodies(serve, body, message):
    s = await serve(env=VERTEX_ENV)
    r = await s.post("/vertex/predict", body)
    assert error_of(await r.get_json(), 400, "invalid_request_error") == message


async def test_without_aip_mode_the_vertex_routes_do_not_exist(serve):
    s = await serve()
    r = await s.post("/predict", {"instances": []})
    assert r.status_code == 404 and await r.get_json() == NOT_FOUND


# -- the HTTP layer -------------------------------------------------------------------------

async def test_unknown_paths_and_wrong_methods_are_404(serve):
    s = await serve()
    for method, path in (("GET", "/nope"), ("GET", "/completion"), ("DELETE", "/props")):
        r = await s.open(path, method=method)
        assert r.status_code == 404 and await r.get_json() == NOT_FOUND


@each_route("GET /health", "GET /props")
async def test_api_key_exempts_only_the_health_routes(serve, path):
    s = await serve("--api-key", KEY)
    r = await s.get(path)
    if path == "/health":
        assert r.status_code == 200
    else:
        assert await r.get_json() == {"error": {"message": "Invalid API Key",
                                                "type": "authentication_error", "code": 401}}
        ok = await s.get(path, headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200


async def test_cors_preflight_is_answered_for_any_path(serve):
    s = await serve()
    r = await s.open("/completion", method="OPTIONS",
                     headers={"Origin": "http://example.com"})
    assert r.status_code == 200
    assert r.headers["Access-Control-Allow-Origin"] == "http://example.com"
    assert "POST" in r.headers["Access-Control-Allow-Methods"]


@pytest.mark.parametrize("spec", [pytest.param(f"{r.method} {r.path}", marks=route(
    f"{r.method} {r.path}"), id=r.path) for r in ROUTES if r.router])
async def test_router_routes_are_not_mounted_on_a_single_model_server(serve, spec):
    """Upstream registers the model-management routes in router mode only."""
    s = await serve()
    method, path = spec.split(" ", 1)
    r = await s.open(path, method=method, json={"model": "x"})
    assert r.status_code == 404 and await r.get_json() == NOT_FOUND

"""Vertex AI custom containers: AIP_MODE=PREDICTION, the port override, the
health alias and the POST /predict fan-out, against a real server."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tests.conftest import ServerProcess, free_port

from .sse import post

pytestmark = pytest.mark.e2e

KEY = "sk-vertex-test"


def vertex_server(model, *args, **env) -> ServerProcess:
    port = free_port()
    srv = ServerProcess(model, "-np", "2", *args,
                        env={"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(port), **env})
    srv.url = f"http://127.0.0.1:{port}"  # not the --port the helper passed
    return srv


@pytest.fixture(scope="module")
def vertex(tiny_model):
    srv = vertex_server(tiny_model, AIP_HEALTH_ROUTE="ping").start()
    yield srv
    srv.stop()


def predict(srv, body, **kw) -> httpx.Response:
    return post(srv.url, body, path="/predict", **kw)


def test_port_override_is_warned_and_health_alias_answers(vertex):
    assert httpx.get(vertex.url + "/ping").json() == {"status": "ok"}
    assert any("overriding server port" in line and "AIP_HTTP_PORT" in line
               for line in vertex.stdout + vertex.stderr)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{vertex.port}/health", timeout=5)


def test_predict_fans_out_in_order(vertex):
    r = predict(vertex, {"instances": [
        {"@requestFormat": "chatCompletions", "max_tokens": 4,
         "messages": [{"role": "user", "content": "Say hello"}]},
        {"@requestFormat": "/completion", "prompt": "x", "n_predict": 3, "stream": True},
        {"@requestFormat": "tokenize", "content": "hello world"},
        "not an object",
        {"prompt": "no format"},
        {"@requestFormat": "noSuchRoute"},
        {"@requestFormat": "completions", "prompt": "y", "max_tokens": 2},
        {"@requestFormat": "health"},
        {"@requestFormat": "chatCompletions", "messages": "not a list"},
    ]})
    assert r.status_code == 200, r.text
    p = r.json()["predictions"]
    assert len(p) == 9
    assert p[0]["object"] == "chat.completion"
    assert p[0]["choices"][0]["message"]["role"] == "assistant"
    assert p[1]["tokens_predicted"] == 3, "stream is forced off: one final result"
    assert p[2]["tokens"] and all(isinstance(t, int) for t in p[2]["tokens"])
    bad = {"code": 400, "type": "invalid_request_error"}
    assert p[3] == {"error": {**bad, "message": "each instance must be a JSON object"}}
    assert p[4] == {"error": {**bad, "message": "each instance must include a string "
                                                "@requestFormat"}}
    assert p[5] == {"error": {**bad, "message": "no handler registered for @requestFormat: "
                                                "noSuchRoute"}}
    assert p[6]["object"] == "text_completion", "completions resolves to /v1/completions"
    assert p[7] == {"status": "ok"}
    assert p[8]["error"]["code"] == 400, "route validation applies per instance"
    assert any("ignoring client-provided stream field" in line
               for line in vertex.stdout + vertex.stderr)


@pytest.mark.parametrize("body, message", [
    ([1, 2], "request body must be a JSON object"),
    ({"instance": []}, "request body must include an array field named instances"),
    ({"instances": {}}, "request body must include an array field named instances"),
    ({"instances": [{}] * 129}, "instances array exceeds maximum size of 128"),
])
def test_bad_predict_bodies(vertex, body, message):
    r = predict(vertex, body)
    assert r.status_code == 400
    assert r.json() == {"error": {"code": 400, "message": message,
                                  "type": "invalid_request_error"}}


def test_invalid_json_is_a_400(vertex):
    r = predict(vertex, b"{not json")
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_many_instances_all_answered(vertex):
    n = 20
    r = predict(vertex, {"instances": [{"@requestFormat": "completion", "prompt": f"p{i}",
                                        "n_predict": 1} for i in range(n)]})
    assert r.status_code == 200
    preds = r.json()["predictions"]
    assert len(preds) == n and all(p["tokens_predicted"] == 1 for p in preds)
    assert all(p["prompt"] == f"p{i}" for i, p in enumerate(preds)), "results in request order"


def test_api_key_applies_to_predict_and_the_alias(tiny_model):
    srv = vertex_server(tiny_model, "--api-key", KEY, AIP_HEALTH_ROUTE="/ping",
                        AIP_PREDICT_ROUTE="vertex/predict").start()
    try:
        body = {"instances": [{"@requestFormat": "tokenize", "content": "a"}]}
        assert post(srv.url, body, path="/vertex/predict").status_code == 401
        assert httpx.get(srv.url + "/ping").status_code == 401
        assert httpx.get(srv.url + "/health").status_code == 200  # the real one stays public
        auth = {"Authorization": f"Bearer {KEY}"}
        r = post(srv.url, body, path="/vertex/predict", headers=auth)
        assert r.status_code == 200 and r.json()["predictions"][0]["tokens"]
        assert httpx.get(srv.url + "/ping", headers=auth).json() == {"status": "ok"}
    finally:
        srv.stop()


def test_predict_route_collision_fails_before_the_model_loads(tiny_model):
    r = subprocess.run([sys.executable, "-m", "mlxcel_trio", "-m", str(tiny_model)],
                       env={**__import__("os").environ, "AIP_MODE": "PREDICTION",
                            "AIP_PREDICT_ROUTE": "/completion"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip() == ("error: AIP_PREDICT_ROUTE=/completion conflicts with an "
                                "existing llama-server route; choose another path")


def test_without_aip_mode_nothing_is_registered(server):
    assert predict(server, {"instances": []}).status_code == 404

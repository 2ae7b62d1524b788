"""Features this server runs without answer exactly as llama-server answers
them when started without the enabling flag (403 stubs and 501s)."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("method,path", [("GET", "/tools"), ("POST", "/tools"),
                                         ("GET", "/cors-proxy"), ("POST", "/cors-proxy")])
def test_ui_tool_routes_are_feature_disabled(server, method, path):
    r = httpx.request(method, server.url + path, json={"tool": "x"})
    assert r.status_code == 403
    assert r.json() == {"error": {"message": "this feature is disabled", "type": "feature_disabled"}}


@pytest.mark.parametrize("method,path,message", [
    ("GET", "/metrics", "This server does not support metrics endpoint. Start it with `--metrics`"),
    ("POST", "/props", "This server does not support changing global properties. "
                       "Start it with `--props`"),
    ("POST", "/slots/0?action=save", "This server does not support slots action. "
                                     "Start it with `--slot-save-path`"),
    ("POST", "/embedding", "This server does not support embeddings. Start it with `--embeddings`"),
    ("POST", "/embeddings", "This server does not support embeddings. Start it with `--embeddings`"),
    ("POST", "/v1/embeddings", "This server does not support embeddings. "
                               "Start it with `--embeddings`"),
    ("POST", "/rerank", "This server does not support reranking. Start it with `--reranking`"),
    ("POST", "/reranking", "This server does not support reranking. Start it with `--reranking`"),
    ("POST", "/v1/rerank", "This server does not support reranking. Start it with `--reranking`"),
    ("POST", "/v1/reranking", "This server does not support reranking. "
                              "Start it with `--reranking`"),
])
def test_features_started_without_answer_501(server, method, path, message):
    # the body is never read: even a malformed one gets the 501
    r = httpx.request(method, server.url + path, content=b"{not json")
    assert r.status_code == 501
    assert r.json() == {"error": {"code": 501, "message": message, "type": "not_supported_error"}}


@pytest.mark.parametrize("path", ["/v1/audio/transcriptions", "/audio/transcriptions"])
def test_transcriptions_answer_a_text_only_models_501(server, path):
    r = httpx.post(server.url + path, files={"file": ("a.wav", b"RIFF....WAVE")},
                   data={"model": "whisper-1"})
    assert r.status_code == 501
    assert r.json() == {"error": {"code": 501, "type": "not_supported_error",
                                  "message": "The current model does not support audio input."}}


def test_lora_adapters_without_adapters(server):
    """Upstream's answers, except that an id naming no adapter is refused
    (upstream ignores it): the client believes an adapter applied."""
    assert httpx.get(server.url + "/lora-adapters").json() == []
    r = httpx.post(server.url + "/lora-adapters", json=[])
    assert r.status_code == 200 and r.json() == {"success": True}
    r = httpx.post(server.url + "/lora-adapters", json=[{"id": 0, "scale": 1.0}])
    assert r.status_code == 400 and r.json()["error"]["message"].startswith(
        "invalid adapter id 0: this server has 0 LoRA adapter(s)")
    r = httpx.post(server.url + "/lora-adapters", json={"id": 0})
    assert r.status_code == 400 and r.json()["error"]["message"] == "Request body must be an array"


def test_props_key_set_follows_upstream(server):
    props = httpx.get(server.url + "/props").json()
    keys = list(props)
    # upstream's keys in upstream's order, then mlxcel's own extensions
    assert keys[-4:] == ["prompt_cache", "geometry", "sleep_idle_seconds", "capabilities"]
    assert keys[:-4] == ["default_generation_settings", "total_slots", "model_alias", "model_ftype",
                    "model_path", "modalities", "media_marker", "endpoint_slots",
                    "endpoint_props", "endpoint_metrics", "ui", "ui_settings", "chat_template",
                    "chat_template_caps", "bos_token", "eos_token", "build_info", "is_sleeping",
                    "cors_proxy_enabled"]

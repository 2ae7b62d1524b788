"""The AIP_* environment (cli/vertex_env.py) and the @requestFormat aliases
(server/surfaces/vertex.py)."""

from __future__ import annotations

import pytest

from mlxcel_trio.cli.vertex_env import GcpConfigError, GcpParams
from mlxcel_trio.protocol.routes import ROUTES
from mlxcel_trio.server.surfaces.vertex import request_format, targets


@pytest.mark.parametrize("path, alias", [
    ("/v1/chat/completions", "chatCompletions"),   # upstream's own examples
    ("/apply-template", "applyTemplate"),
    ("/slots/:id_slot", "slots"),
    ("/v1/messages/count_tokens", "messagesCountTokens"),
    ("/chat/completions/input_tokens", "chatCompletionsInputTokens"),
    ("/v1", "v1"),
])
def test_request_format(path, alias):
    assert request_format(path) == alias


def test_aliases_cover_every_route_and_prefer_v1():
    aliases, methods = targets()
    served = [r for r in ROUTES if not r.vertex]
    assert set(methods) == {r.path for r in served}
    assert set(aliases) == {request_format(r.path) for r in served}
    assert aliases["completions"] == "/v1/completions"
    assert aliases["chatCompletions"] == "/v1/chat/completions"
    assert methods["/props"] == "GET", "a path's first registered method serves it"


def test_inert_without_prediction_mode():
    assert GcpParams.from_env({"AIP_HTTP_PORT": "9", "AIP_PREDICT_ROUTE": "/completion"}) == \
        GcpParams()
    assert not GcpParams.from_env({"AIP_MODE": "prediction"}).enabled


def test_defaults_and_leading_slash():
    p = GcpParams.from_env({"AIP_MODE": "PREDICTION", "AIP_HEALTH_ROUTE": "hc",
                            "AIP_PREDICT_ROUTE": "", "AIP_HTTP_PORT": ""})
    assert (p.enabled, p.health_path, p.predict_path, p.port) == (True, "/hc", "/predict", 8080)
    assert GcpParams.from_env({"AIP_MODE": "PREDICTION"}).health_path == ""


@pytest.mark.parametrize("env, words", [
    ({"AIP_HTTP_PORT": "eighty"}, "AIP_HTTP_PORT 'eighty': not a port number"),
    ({"AIP_HTTP_PORT": "70000"}, "AIP_HTTP_PORT '70000': out of range"),
    ({"AIP_PREDICT_ROUTE": "v1/chat/completions"},
     "AIP_PREDICT_ROUTE=/v1/chat/completions conflicts with an existing llama-server route"),
])
def test_unusable_settings_are_refused(env, words):
    with pytest.raises(GcpConfigError, match=words.replace("(", r"\(")):
        GcpParams.from_env({"AIP_MODE": "PREDICTION", **env})

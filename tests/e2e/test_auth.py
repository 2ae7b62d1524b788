"""--api-key / LLAMA_API_KEY against a real server.

Upstream's middleware reads `Authorization`, or `X-Api-Key` when that header
is empty, strips a leading "Bearer ", and compares the rest with every key;
only /health and /v1/health are exempt.  Keys here are distinctive strings so
the log check cannot match by accident, and the servers run with -v so there
is as much log as possible to leak into.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from .sse import stream_frames

pytestmark = pytest.mark.e2e

K1, K2 = "key-one-7f3a9", "key-two-c41d8"
ENV_KEY, CLI_KEY = "env-key-52be7", "cli-key-90aa3"
UNAUTHORIZED = '{"error":{"message":"Invalid API Key","type":"authentication_error","code":401}}'
LIGHT = ("-c", "512", "-np", "1", "-v")


def drained_logs(srv) -> str:
    """Stop the server and wait (bounded) for its log pumps to reach EOF."""
    srv.stop()
    return srv.drain(10)


def call(srv, method: str, path: str, headers: dict | None = None) -> httpx.Response:
    body = {"tokenize": {"content": "hi"}, "detokenize": {"tokens": [71]}}.get(
        path.strip("/"), {"prompt": "x", "n_predict": 1})
    return httpx.request(method, srv.url + path, headers=headers, timeout=30,
                         **({"json": body} if method == "POST" else {}))


@pytest.fixture(scope="module")
def keyed(tiny_model, start_server):
    srv = start_server(tiny_model, *LIGHT, "--api-key", f"{K1},{K2}")
    yield srv
    logs = drained_logs(srv)
    assert srv.stdout, "the server printed nothing: the leak check would be empty"
    for key in (K1, K2):
        assert key not in logs


PROTECTED = [("POST", "/completion"), ("POST", "/completions"), ("POST", "/v1/completions"),
             ("GET", "/props"), ("GET", "/models"), ("GET", "/v1/models"), ("GET", "/slots"),
             ("POST", "/tokenize"), ("POST", "/detokenize")]


@pytest.mark.parametrize("method,path", PROTECTED)
def test_no_key_is_401(keyed, method, path):
    r = call(keyed, method, path)
    assert r.status_code == 401
    assert r.text == UNAUTHORIZED
    assert r.headers["server"] == "llama.cpp"


@pytest.mark.parametrize("path", ["/health", "/v1/health"])
def test_health_routes_are_exempt(keyed, path):
    r = call(keyed, "GET", path)
    assert r.status_code == 200 and r.json() == {"status": "ok"}


@pytest.mark.parametrize("headers", [
    {"Authorization": f"Bearer {K1}"},
    {"Authorization": f"Bearer {K2}"},
    {"X-Api-Key": K2},
    {"X-Api-Key": K1},
    {"Authorization": K1},              # upstream strips "Bearer " only if present
    {"X-Api-Key": f"Bearer {K2}"},      # ... from whichever header it read
])
def test_valid_keys_are_accepted(keyed, headers):
    r = call(keyed, "GET", "/props", headers)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("method,path", PROTECTED)
def test_a_key_opens_every_route(keyed, method, path):
    r = call(keyed, method, path, {"Authorization": f"Bearer {K1}"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("headers", [
    {"Authorization": "Bearer nope"},
    {"X-Api-Key": "nope"},
    {"Authorization": f"Bearer {K1[:-1]}"},          # a prefix of a real key
    {"X-Api-Key": K2[:4]},
    {"Authorization": f"Bearer {K1}x"},              # a real key plus a suffix
    {"Authorization": f"Bearer {K1},{K2}"},          # the flag's list verbatim
    {"Authorization": f"bearer {K1}"},               # the prefix is case-sensitive
    {"Authorization": f"Bearer  {K1}"},              # one space only
    {"Authorization": "Bearer nope", "X-Api-Key": K1},  # Authorization wins when present
])
def test_wrong_keys_are_rejected(keyed, headers):
    r = call(keyed, "GET", "/props", headers)
    assert r.status_code == 401
    assert r.text == UNAUTHORIZED


def test_unknown_path_needs_a_key_first(keyed):
    assert call(keyed, "GET", "/nope").status_code == 401
    r = call(keyed, "GET", "/nope", {"Authorization": f"Bearer {K1}"})
    assert r.status_code == 404


def test_streaming_and_sdk_with_a_key(keyed):
    frames, _ = stream_frames(keyed.url, {"prompt": "x", "n_predict": 3},
                              headers={"X-Api-Key": K2})
    assert frames[-1]["stop"] is True
    with openai.OpenAI(base_url=keyed.url + "/v1", api_key=K1, max_retries=0) as client:
        assert client.completions.create(model="m", prompt="x", max_tokens=2).usage \
            .completion_tokens == 2
    with openai.OpenAI(base_url=keyed.url + "/v1", api_key="nope", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError) as info:
            client.models.list()
    assert info.value.status_code == 401
    assert info.value.body == {"message": "Invalid API Key", "type": "authentication_error",
                               "code": 401}


def test_environment_key_when_no_flag(tiny_model, start_server):
    srv = start_server(tiny_model, *LIGHT, env={"LLAMA_API_KEY": ENV_KEY})
    try:
        assert call(srv, "GET", "/props").status_code == 401
        assert call(srv, "GET", "/props", {"Authorization": f"Bearer {ENV_KEY}"}).status_code == 200
        assert call(srv, "GET", "/health").status_code == 200
    finally:
        assert ENV_KEY not in drained_logs(srv)


def test_command_line_beats_environment(tiny_model, start_server):
    srv = start_server(tiny_model, *LIGHT, "--api-key", CLI_KEY, env={"LLAMA_API_KEY": ENV_KEY})
    try:
        assert call(srv, "GET", "/props", {"Authorization": f"Bearer {CLI_KEY}"}).status_code == 200
        r = call(srv, "GET", "/props", {"Authorization": f"Bearer {ENV_KEY}"})
        assert r.status_code == 401 and r.text == UNAUTHORIZED
    finally:
        logs = drained_logs(srv)
        assert CLI_KEY not in logs and ENV_KEY not in logs


@pytest.mark.parametrize("path,key", [("/completion", "wrong-key"), ("/no-such-route", K1)])
def test_an_answer_before_the_body_is_read_does_not_wedge_the_connection(keyed, path, key):
    """A 401 from the gate (or a 404) answers without reading the body; on a
    kept-alive connection the unread rest of a large body then hung the next
    request.  Such an answer closes the connection instead, so the client's
    next request goes out on a fresh one."""
    body = b'{"prompt": "' + b"x" * (4 << 20) + b'"}'
    with httpx.Client(base_url=keyed.url, timeout=20) as c:
        for _ in range(3):
            r = c.post(path, content=body, headers={"Authorization": f"Bearer {key}",
                                                    "Content-Type": "application/json"})
            assert r.status_code in (401, 404), r.text
            r = c.get("/slots", headers={"Authorization": f"Bearer {K1}"})
            assert r.status_code == 200

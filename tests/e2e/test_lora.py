"""LoRA adapters on a real server: upstream's options and routes, the
per-request `lora` field, live global scales that never touch a generation
in flight, the prompt cache keyed by scales, and the refusals."""

from __future__ import annotations

import os

import httpx
import pytest

from .sse import iter_sse_lines, post, startup_refusal

pytestmark = pytest.mark.e2e

PROMPT = "the quick brown fox"
BODY = {"prompt": PROMPT, "n_predict": 16, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def adapters():
    from fixtures.build import ensure

    return str(ensure("tiny-lora")), str(ensure("tiny-lora-peft"))


@pytest.fixture(scope="module")
def lora_server(tiny_model, adapters, start_server):
    mlx, peft = adapters
    srv = start_server(tiny_model, "-c", "4096", "-np", "4", "--lora", mlx,
                       "--lora-scaled", f"{peft}:0.5")
    yield srv
    srv.stop()


def _run(srv, **extra) -> dict:
    r = post(srv.url, {**BODY, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def _set(srv, scales) -> None:
    r = httpx.post(srv.url + "/lora-adapters",
                   json=[{"id": i, "scale": s} for i, s in enumerate(scales)])
    assert r.status_code == 200 and r.json() == {"success": True}, r.text


def test_get_reports_each_adapter_in_upstreams_shape(lora_server, adapters):
    assert httpx.get(lora_server.url + "/lora-adapters").json() == [
        {"id": 0, "path": adapters[0], "scale": 1.0, "task_name": "", "prompt_prefix": ""},
        {"id": 1, "path": adapters[1], "scale": 0.5, "task_name": "", "prompt_prefix": ""},
    ]
    props = httpx.get(lora_server.url + "/props").json()
    assert props["default_generation_settings"]["params"]["lora"] == [
        {"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}]
    names = [os.path.basename(a.rstrip("/")) for a in adapters]
    line = lora_server.wait_for_text("main: choices: ")
    assert f"LoRA {names[0]} x1, {names[1]} x0.5" in line, line


def test_the_request_field_overrides_the_global_scales(lora_server, server):
    base = _run(server)["content"]
    default = _run(lora_server)
    assert default["generation_settings"]["lora"] == [{"id": 0, "scale": 1.0},
                                                      {"id": 1, "scale": 0.5}]
    # listed ids take their scale, the others drop to 0 (upstream's rule)
    only0 = _run(lora_server, lora=[{"id": 0, "scale": 1.0}])
    assert only0["generation_settings"]["lora"] == [{"id": 0, "scale": 1.0},
                                                    {"id": 1, "scale": 0.0}]
    # /slots reports each slot's last task with the vector it ran with
    reported = [s["params"]["lora"] for s in httpx.get(lora_server.url + "/slots").json()
                if "params" in s]
    assert [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.0}] in reported
    off = _run(lora_server, lora=[])
    assert off["content"] == base  # every scale 0: the base model's output
    explicit = _run(lora_server, lora=[{"id": 1, "scale": 0.5}, {"id": 0, "scale": 1.0}])
    assert explicit["content"] == default["content"]
    assert len({base, default["content"], only0["content"]}) == 3


def test_the_field_works_on_the_chat_routes(lora_server):
    def chat(lora):
        r = post(lora_server.url, {"messages": [{"role": "user", "content": "hi"}],
                                   "max_tokens": 12, "temperature": 0.0, "lora": lora},
                 path="/v1/chat/completions")
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    assert chat([]) != chat([{"id": 0, "scale": 1.0}])

    def messages(lora):
        r = post(lora_server.url, {"model": "x", "messages": [{"role": "user", "content": "hi"}],
                                   "max_tokens": 12, "temperature": 0.0, "lora": lora},
                 path="/v1/messages")
        assert r.status_code == 200, r.text
        return r.json()["content"][0]["text"]

    assert messages([]) == chat([]) and messages([{"id": 0, "scale": 1.0}]) == chat(
        [{"id": 0, "scale": 1.0}])


def test_a_global_change_reaches_the_next_request_not_the_one_in_flight(lora_server):
    """Upstream copies the scales into the slot when a task starts; here a
    request keeps the vector it was parsed with."""
    body = {**BODY, "n_predict": 48, "stream": True}
    solo = _run(lora_server, n_predict=48)["content"]
    try:
        text = []
        with httpx.Client(timeout=60) as c, \
                c.stream("POST", lora_server.url + "/completion", json=body) as r:
            lines = iter_sse_lines(r)
            import json

            for line in lines:
                if line.startswith("data: "):
                    text.append(json.loads(line[6:])["content"])
                    break
            _set(lora_server, (0.0, 0.0))  # while the stream is running
            for line in lines:
                if line.startswith("data: "):
                    text.append(json.loads(line[6:])["content"])
        assert "".join(text) == solo
        after = _run(lora_server, n_predict=48)
        assert after["content"] != solo
        assert after["content"] == _run(lora_server, n_predict=48, lora=[])["content"]
        assert httpx.get(lora_server.url + "/lora-adapters").json()[1]["scale"] == 0.0
    finally:
        _set(lora_server, (1.0, 0.5))


def test_the_prompt_cache_keys_entries_by_scales(lora_server):
    prompt = "a long shared prefix " * 12
    first = _run(lora_server, prompt=prompt, lora=[{"id": 0, "scale": 0.25}])
    other = _run(lora_server, prompt=prompt, lora=[{"id": 0, "scale": 0.75}])
    again = _run(lora_server, prompt=prompt, lora=[{"id": 0, "scale": 0.25}])
    n = first["tokens_evaluated"]
    assert first["timings"]["cache_n"] == 0
    assert other["timings"]["cache_n"] == 0 and other["tokens_cached"] == n + 15
    assert again["timings"]["cache_n"] >= n - 1
    assert again["content"] == first["content"] != other["content"]


@pytest.mark.parametrize(("lora", "message"), [
    ({"id": 0, "scale": 1.0},
     "Field 'lora': Error: 'lora' must be an array of objects with 'id' and 'scale' fields"),
    ([{"id": 0, "scale": "high"}],
     "Field 'lora': Error: 'lora' must be an array of objects with 'id' and 'scale' fields"),
    ([{"id": 0}],
     "Field 'lora': Error: 'lora' must be an array of objects with 'id' and 'scale' fields"),
    ([7], "Field 'lora': Error: 'lora' must be an array of objects with 'id' and 'scale' fields"),
    ([{"id": 2, "scale": 1.0}],
     "Field 'lora': invalid adapter id 2: this server has 2 LoRA adapter(s), ids 0 to 1"),
])
def test_bad_lora_fields_are_refused(lora_server, lora, message):
    r = post(lora_server.url, {**BODY, "lora": lora})
    assert r.status_code == 400 and r.json()["error"] == {
        "code": 400, "message": message, "type": "invalid_request_error"}


@pytest.mark.parametrize(("body", "message"), [
    ({"id": 0, "scale": 1.0}, "Request body must be an array"),
    ([{"id": 0, "scale": None}],
     "Request body must be an array of objects with 'id' and 'scale' fields"),
    ([{"id": -1, "scale": 1.0}],
     "invalid adapter id -1: this server has 2 LoRA adapter(s), ids 0 to 1"),
])
def test_bad_posts_are_refused_and_change_nothing(lora_server, body, message):
    r = httpx.post(lora_server.url + "/lora-adapters", json=body)
    assert r.status_code == 400 and r.json()["error"]["message"] == message
    assert [a["scale"] for a in httpx.get(lora_server.url + "/lora-adapters").json()] == [1.0, 0.5]


def test_init_without_apply_serves_the_base_model_until_raised(tiny_model, adapters, server,
                                                              start_server):
    srv = start_server(tiny_model, "-c", "4096", "-np", "4", "--lora", ",".join(adapters),
                       "--lora-init-without-apply")
    try:
        assert [a["scale"] for a in httpx.get(srv.url + "/lora-adapters").json()] == [0.0, 0.0]
        assert _run(srv)["content"] == _run(server)["content"]
        _set(srv, (1.0, 0.0))
        assert _run(srv)["content"] == _run(srv, lora=[{"id": 0, "scale": 1.0}])["content"] \
            != _run(server)["content"]
    finally:
        srv.stop()


def test_startup_refusals(tiny_model, tiny_wide_model, adapters, tmp_path):
    dora = tmp_path / "dora"
    dora.mkdir()
    (dora / "adapter_config.json").write_text(
        '{"fine_tune_type": "dora", "lora_parameters": {"rank": 4, "scale": 1.0}}')
    err = startup_refusal(tiny_model, "--lora", f"{adapters[0]},{dora}",
                          "--lora", str(tmp_path / "missing"))
    assert "DoRA" in err and "mlx_lm.fuse" in err and "no such adapter directory" in err
    err = startup_refusal(tiny_model, "--lora-scaled", f"{adapters[0]}", "--lora-scaled", "x:big")
    assert "lora-scaled format: FNAME:SCALE" in err and "is not a number" in err
    # an adapter trained for another shape: refused at load, naming the module
    err = startup_refusal(tiny_wide_model, "--lora", adapters[0])
    assert "takes 64 inputs" in err and "adapter trained for another model" in err

"""The legacy chat path against a real server: --no-jinja formats the
prompt with the built-in format detected from the checkpoint's template
(the fixture's is ChatML-shaped), refuses tools with llama-server's words
and status, and reports the template as upstream does; a built-in name
given to --chat-template serves with its format.

The conversation is chosen so that the fixture's own Jinja template would
render it differently (text parts run together there, tool results become
user turns, reasoning is written back in <think>), so each assertion on a
prompt fails if the Jinja path answered instead.
"""

from __future__ import annotations

import subprocess
import sys

import httpx
import openai
import pytest

from mlxcel_trio.chat.template import CHATML

from .sse import post

pytestmark = pytest.mark.e2e

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "What is"},
                                 {"type": "text", "text": "the engine?"}]},
    {"role": "assistant", "content": "A loop.", "reasoning_content": "think"},
    {"role": "tool", "content": "42", "tool_call_id": "c1"},
]
LEGACY_CHATML = ("<|im_start|>system\nBe brief.<|im_end|>\n"
                 "<|im_start|>user\nWhat is\nthe engine?<|im_end|>\n"
                 "<|im_start|>assistant\nA loop.<|im_end|>\n"
                 "<|im_start|>tool\n42<|im_end|>\n"
                 "<|im_start|>assistant\n")
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
CHAT = "/v1/chat/completions"


def prompt_of(url: str, body: dict) -> str:
    r = post(url, body, path="/apply-template")
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


@pytest.fixture(scope="module")
def no_jinja(tiny_model, start_server):
    srv = start_server(tiny_model, "--no-jinja", "-np", "1", "-c", "1024")
    yield srv
    srv.stop()


def test_no_jinja_formats_with_the_detected_format(no_jinja):
    assert prompt_of(no_jinja.url, {"messages": CONVERSATION}) == LEGACY_CHATML
    with openai.OpenAI(base_url=no_jinja.url + "/v1", api_key="x", max_retries=0) as c:
        res = c.chat.completions.create(model="m", messages=CONVERSATION, max_tokens=4,
                                        temperature=0)
    assert res.choices[0].message.role == "assistant"
    assert isinstance(res.choices[0].message.content, str)
    tokens = httpx.post(no_jinja.url + "/tokenize", json={"content": LEGACY_CHATML}).json()
    assert res.usage.prompt_tokens == len(tokens["tokens"])


def test_no_jinja_output_is_content_streamed_or_not(no_jinja):
    # content only on this path: the deltas concatenate to the message, with no reasoning
    msgs = [{"role": "user", "content": "Hi"}]
    kw = {"model": "m", "messages": msgs, "max_tokens": 6, "temperature": 0,
          "extra_body": {"ignore_eos": True}}
    with openai.OpenAI(base_url=no_jinja.url + "/v1", api_key="x", max_retries=0) as c:
        whole = c.chat.completions.create(**kw).choices[0].message
        parts = [ch.choices[0].delta.content or "" for ch in
                 c.chat.completions.create(stream=True, **kw) if ch.choices]
    assert whole.content == "".join(parts)
    assert getattr(whole, "reasoning_content", None) is None


def test_no_jinja_refuses_tools_with_upstreams_words(no_jinja):
    # upstream's words, as a 4xx (upstream: 500): the request cannot succeed here
    r = post(no_jinja.url, {"messages": [CONVERSATION[0]], "tools": TOOLS}, path=CHAT)
    assert r.status_code == 400
    assert r.json() == {"error": {"code": 400, "message": "tools param requires --jinja flag",
                                  "type": "invalid_request_error"}}
    r = post(no_jinja.url, {"messages": [CONVERSATION[0]], "tool_choice": "required"},
             path=CHAT)
    assert (r.status_code, r.json()["error"]["message"]) == \
        (400, "tool_choice param requires --jinja flag")
    # the OpenAI SDK retries a 5xx; a 4xx reaches the caller on the first answer
    sdk = openai.OpenAI(base_url=no_jinja.url + "/v1", api_key="none", max_retries=2)
    with pytest.raises(openai.BadRequestError, match="tools param requires --jinja flag"):
        sdk.chat.completions.create(model="m", messages=[CONVERSATION[0]], tools=TOOLS)
    assert httpx.get(no_jinja.url + "/health").status_code == 200  # and keeps serving


def test_no_jinja_props_report_the_template(no_jinja, tiny_model):
    props = httpx.get(no_jinja.url + "/props").json()
    assert props["chat_template"] == (tiny_model / "chat_template.jinja").read_text()
    assert "chat_template_tool_use" not in props


def test_chat_template_chatml_serves(tiny_model, start_server):
    srv = start_server(tiny_model, "--chat-template", "chatml", "-np", "1", "-c", "1024")
    try:
        assert httpx.get(srv.url + "/props").json()["chat_template"] == CHATML
        # upstream's ChatML Jinja template: tool results stay tool turns
        assert "<|im_start|>tool\n42<|im_end|>" in prompt_of(srv.url, {"messages": CONVERSATION})
        with openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0) as c:
            res = c.chat.completions.create(model="m", messages=CONVERSATION[:2], max_tokens=2)
        assert res.choices[0].finish_reason in ("length", "stop")
    finally:
        srv.stop()


def test_a_builtin_name_selects_its_format(tiny_model, start_server):
    srv = start_server(tiny_model, "--chat-template", "llama3", "-np", "1", "-c", "1024")
    try:
        body = {"messages": [CONVERSATION[0], {"role": "user", "content": "Hi"}]}
        assert prompt_of(srv.url, body) == (
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n")
        assert httpx.get(srv.url + "/props").json()["chat_template"] == "llama3"
    finally:
        srv.stop()


def test_no_jinja_refuses_a_template_it_cannot_recognise_before_loading(tiny_model):
    proc = subprocess.run([sys.executable, "-m", "mlxcel_trio", "-m", str(tiny_model),
                           "--no-jinja", "--chat-template", "{{ messages }}"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: --chat-template '{{ messages }}': the supplied chat "
                                  "template is not supported")
    assert "main: model loaded" not in proc.stdout

"""Tool calls in each family's own dialect, end to end: a real server per
chat template (`--jinja --chat-template-file`), spoken to through the
official OpenAI SDK.

The fixture model's weights are random, so a call comes out only where the
server forces one: `tool_choice: "required"` opens the call in the
template's own syntax and the grammar holds the rest to the tool's schema
and the family's markers.  For each family: the call comes back parsed;
with `parse_tool_calls: false` the same generation comes back raw, written
in the family's markers; streamed, the deltas (id and name first, then
argument fragments) assemble to the same call, and no delta reports it as
content."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

pytestmark = pytest.mark.e2e

TEMPLATES = Path(__file__).resolve().parents[3] / "shared/upstream/chat-templates"
if not TEMPLATES.is_dir():  # a worktree beside the main checkout
    TEMPLATES = Path(__file__).resolve().parents[4] / "shared/upstream/chat-templates"

# template file -> a marker of the family's own call syntax in the raw output
FAMILIES = {
    "openai-gpt-oss-120b.jinja": "to=functions.get_weather <|constrain|>json<|message|>",
    "Qwen3-Coder.jinja": "</parameter>",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": "[ARGS]",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "[TOOL_CALLS]",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "<｜tool▁call▁end｜>",
    "deepseek-ai-DeepSeek-V3.1.jinja": "<｜tool▁sep｜>",
    "deepseek-ai-DeepSeek-V3.2.jinja": "｜DSML｜invoke",
    "GLM-4.6.jinja": "<arg_key>",
    "Kimi-K2-Instruct.jinja": "<|tool_call_argument_begin|>",
    "Kimi-K3.jinja": '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument',
    "MiniMax-M2.jinja": '<parameter name="',
    "MiniMax-M3.jinja": "]<]minimax[>[<city>Paris]<]minimax[>[</city>",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": '"tool_name"',
    "ibm-granite-granite-3.3-2B-Instruct.jinja": "<|tool_call|>",
    "meetkai-functionary-medium-v3.1.jinja": "</function>",
    "meetkai-functionary-medium-v3.2.jinja": "get_weather\n",
    "fireworks-ai-llama-3-firefunction-v2.jinja": "functools[",
    "Apertus-8B-Instruct.jinja": "<|tools_suffix|>",
    "ByteDance-Seed-OSS.jinja": "</seed:tool_call>",
    "NVIDIA-Nemotron-Nano-v2.jinja": "</TOOLCALL>",
    "unsloth-Apriel-1.5.jinja": "</tool_calls>",
    "GigaChat3-10B-A1.8B.jinja": "function call<|role_sep|>",
    "openbmb-MiniCPM5-1B.jinja": "</param>",
    "LFM2.5-8B-A1B.jinja": 'city="Paris")]<|tool_call_end|>',
    "google-gemma-4-31B-it.jinja": 'city:<|"|>Paris<|"|>}<tool_call|>',
    "Qwen-Qwen3-0.6B.jinja": "</tool_call>",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": '"parameters"',
}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris"]}},
                   "required": ["city"], "additionalProperties": False}}}]
USER = {"role": "user", "content": "Weather in Paris?"}
# a reasoning budget of 0: the call comes at once (with reasoning allowed the
# random weights may think past max_tokens; test_forced_after_reasoning covers that)
KW = dict(model="m", messages=[USER], tools=TOOLS, tool_choice="required", temperature=0,
          max_tokens=200, parallel_tool_calls=False)
NOW = {"reasoning_budget_tokens": 0}


def template_server(name: str, tiny_model, start_server):
    """A server on the tiny fixture with one of upstream's chat templates."""
    path = TEMPLATES / name
    if not path.exists():
        pytest.skip("../shared/upstream/chat-templates is absent")
    srv = start_server(tiny_model, "-c", "4096", "-np", "1", "--jinja",
                       "--chat-template-file", str(path))
    yield srv
    srv.stop()


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tiny_model, start_server):
    for srv in template_server(request.param, tiny_model, start_server):
        yield request.param, openai.OpenAI(base_url=srv.url + "/v1", api_key="x",
                                           max_retries=0)


def test_a_required_call_in_the_family_dialect(family):
    name, client = family
    res = client.chat.completions.create(**KW, extra_body=NOW).choices[0]
    (call,) = res.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert res.finish_reason == "tool_calls" and not res.message.content

    raw = client.chat.completions.create(**KW, extra_body={**NOW, "parse_tool_calls": False})
    text = raw.choices[0].message.content or ""
    assert FAMILIES[name] in _opener(name) + text, text

    chunks = list(client.chat.completions.create(stream=True, **KW, extra_body=NOW))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not "".join(d.content or "" for d in deltas)
    parts = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert parts[0].id and parts[0].function.name == "get_weather"
    assert all(p.function.name is None for p in parts[1:])
    assert "".join(p.function.arguments or "" for p in parts) == call.function.arguments


def _opener(name: str) -> str:
    """The forced opening the server wrote before the model's text."""
    from mlxcel_trio.chat.dialects import detect
    return detect((TEMPLATES / name).read_text(encoding="utf-8")).opener(None)


@pytest.fixture(scope="module")
def primed(tiny_model, start_server):
    """DeepSeek R1's template opens the thinking block in its prompt."""
    for srv in template_server("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", tiny_model,
                               start_server):
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)


def test_forced_after_reasoning(primed):
    """With reasoning allowed, the required call comes after the thoughts
    (the budget closes the block after 3 tokens, the grammar then writes the
    call): reasoning_content and the call both come back, streamed alike."""
    body = {"reasoning_budget_tokens": 3}
    res = primed.chat.completions.create(**KW, extra_body=body).choices[0]
    (call,) = res.message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert getattr(res.message, "reasoning_content", None), res.message
    assert res.finish_reason == "tool_calls" and not res.message.content
    raw = primed.chat.completions.create(**KW, extra_body={**body, "parse_tool_calls": False,
                                                           "reasoning_format": "none"})
    text = raw.choices[0].message.content or ""
    assert "</think>" in text and text.index("</think>") < text.index("<｜tool▁call▁begin｜>")
    chunks = list(primed.chat.completions.create(stream=True, **KW, extra_body=body))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == \
        res.message.reasoning_content
    assert not "".join(d.content or "" for d in deltas)
    parts = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert "".join(p.function.arguments or "" for p in parts) == call.function.arguments

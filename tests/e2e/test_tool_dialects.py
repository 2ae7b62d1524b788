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
content.

Then an agent loop on four of the templates (GPT-OSS, Qwen3-Coder, Mistral
Small 3.2, DeepSeek V3.1), through the OpenAI and the Anthropic SDKs: the
model calls a tool, the client answers with the tool's result, and the
model answers, streamed.  The call is forced (tool_choice required / any),
the answer is whatever the random weights write: what is checked is the
protocol (the call comes back parsed, the result is rendered back through
the template, so its text reaches the prompt, and the streamed answer
assembles to the non-streamed one), and that a client dropping a streamed
call frees the slot.

One server per template, shared by every test here that uses the template
(pytest orders a module-scoped parameter's tests together)."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.conftest import wait_until

from .sse import iter_sse_lines, post

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
    "GLM-4.7-Flash.jinja": "get_weather<arg_key>city</arg_key><arg_value>",  # no newlines, as 4.7 renders
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
    "GigaChat3.1-10B-A1.8B.jinja": '<|function_call|>{"name": "get_weather", "arguments": ',
    "openbmb-MiniCPM5-1B.jinja": "</param>",
    "LFM2.5-8B-A1B.jinja": 'city="Paris")]<|tool_call_end|>',
    "google-gemma-4-31B-it.jinja": 'city:<|"|>Paris<|"|>}<tool_call|>',
    "Qwen-Qwen3-0.6B.jinja": "</tool_call>",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": '"parameters"',
    "muse-glimmer.jinja": '<|message|><atem:function_calls>\n<atem:invoke name="get_weather">',
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
def template(request, tiny_model, start_server):
    """(template file name, its server); a test narrows the templates with
    `@pytest.mark.parametrize("template", [...], indirect=True)`."""
    for srv in template_server(request.param, tiny_model, start_server):
        yield request.param, srv


def _openai(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)


def test_a_required_call_in_the_family_dialect(template):
    name, srv = template
    client = _openai(srv)
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


# DeepSeek R1's template opens the thinking block in its prompt
@pytest.mark.parametrize("template", ["deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"],
                         indirect=True)
def test_forced_after_reasoning(template):
    """With reasoning allowed, the required call comes after the thoughts
    (the budget closes the block after 3 tokens, the grammar then writes the
    call): reasoning_content and the call both come back, streamed alike."""
    primed = _openai(template[1])
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


# template -> how its prompt's closed empty block (thinking off) leads the content
THINKING_OFF = {"Qwen-Qwen3-0.6B.jinja": "", "HuggingFaceTB-SmolLM3-3B.jinja": "\n"}


@pytest.mark.parametrize("template", sorted(THINKING_OFF), indirect=True)
def test_thinking_off_reads_a_written_block_as_content(template):
    """With thinking off the prompt closes an empty thinking block, and
    upstream then reads a block the model writes anyway as content (and
    SmolLM3's answer after the prompt's bare close starts with the newline
    its template wrote there): the server tells its parser what the prompt
    closed.  The continued assistant text stands in for the model's."""
    name, srv = template
    said = "<think>plan</think>Hello"
    res = _openai(srv).chat.completions.create(
        model="m", messages=[USER, {"role": "assistant", "content": said}], max_tokens=2,
        temperature=0, extra_body={"chat_template_kwargs": {"enable_thinking": False},
                                   "echo": True}).choices[0].message
    assert res.content.startswith(THINKING_OFF[name] + said), res
    assert not getattr(res, "reasoning_content", None)


# ---- an agent loop: call, result, answer ----------------------------------------

LOOP = ["openai-gpt-oss-120b.jinja", "Qwen3-Coder.jinja",
        "Mistral-Small-3.2-24B-Instruct-2506.jinja", "deepseek-ai-DeepSeek-V3.1.jinja"]
RESULT = "sunny-and-21C"
LOOPING = pytest.mark.parametrize("template", LOOP, indirect=True)


@LOOPING
def test_openai_call_result_answer(template):
    server = template[1]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    first = client.chat.completions.create(model="m", messages=[USER], tools=TOOLS,
                                           tool_choice="required", temperature=0, parallel_tool_calls=False,
                                           max_tokens=200, extra_body=NOW).choices[0].message
    (call,) = first.tool_calls
    assert call.function.name == "get_weather"
    history = [USER, {"role": "assistant", "content": "", "tool_calls": [
        {"id": call.id, "type": "function",
         "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
    prompt = post(server.url, {"messages": history, "tools": TOOLS},
                  path="/apply-template").json()["prompt"]
    assert RESULT in prompt and "get_weather" in prompt
    kw = dict(model="m", messages=history, tools=TOOLS, temperature=0, max_tokens=16,
              extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kw).choices[0].message
    chunks = list(client.chat.completions.create(stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert text == (whole.content or "") and len(calls) == len(whole.tool_calls or [])


@LOOPING
def test_anthropic_tool_use_result_answer(template):
    server = template[1]
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    tools = [{"name": "get_weather", "description": "Weather in a city",
              "input_schema": TOOLS[0]["function"]["parameters"]}]
    first = client.messages.create(model="m", max_tokens=200, messages=[USER], tools=tools,
                                   tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                   extra_body={"temperature": 0})
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    assert first.stop_reason == "tool_use"
    history = [USER, {"role": "assistant", "content": [
        {"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use.id, "content": RESULT}]}]
    kw = dict(model="m", max_tokens=16, messages=history, tools=tools,
              extra_body={"temperature": 0})
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == [b.type for b in whole.content]
    assert json.dumps([b.model_dump() for b in final.content if b.type == "text"]) == \
        json.dumps([b.model_dump() for b in whole.content if b.type == "text"])


# A tool whose one argument must be long: the forced call runs for thousands
# of steps, far past the bound below, unless the cancel frees the slot.
LONG = [{"type": "function", "function": {
    "name": "write_note", "description": "Write a note",
    "parameters": {"type": "object", "properties": {"text": {"type": "string",
                                                               "minLength": 20000}},
                   "required": ["text"], "additionalProperties": False}}}]
FREE_BOUND_S = 3.0  # generous: the engine frees a slot before its next step


def _processing(url: str) -> bool:
    return any(s["is_processing"] for s in httpx.get(url + "/slots", timeout=10).json())


@LOOPING
def test_a_cancel_in_the_middle_of_a_call_frees_the_slot(template):
    """The client drops a streamed call after its first delta: the slot is
    free within a step (the one-slot server serves the next request)."""
    name, server = template
    if name == "Qwen3-Coder.jinja":
        pytest.skip("its string parameters are written as tags, without a length bound")
    body = {"model": "m", "messages": [USER], "tools": LONG, "tool_choice": "required",
            "temperature": 0, "max_tokens": 8000, "stream": True, **NOW}
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            for line in iter_sse_lines(r):
                if line.startswith("data: {") and '"tool_calls"' in line:
                    frame = json.loads(line[6:])
                    assert frame["choices"][0]["finish_reason"] is None
                    # read before leaving the loop, which closes the stream
                    assert _processing(server.url), "the call should still be generating"
                    break
    # the response is closed: the slot is freed before the engine's next steps
    wait_until(lambda: _processing(server.url), "the slot freed after the cancel",
               FREE_BOUND_S, until=lambda busy: not busy, pause=0.01)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    after = client.chat.completions.create(model="m", messages=[USER], tools=TOOLS,
                                           tool_choice="required", temperature=0,
                                           parallel_tool_calls=False, max_tokens=200,
                                           extra_body=NOW)
    assert after.choices[0].message.tool_calls[0].function.name == "get_weather"

"""chat/dialects on each family's own output: detection from the real
templates, full parses of single and parallel calls with and beside
reasoning, malformed calls as content, and the streaming rule (every
prefix's partial parse is a prefix of the final one, and no call is ever
reported first as content)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlxcel_trio.chat.dialects import BY_NAME, detect, parse

TEMPLATES = Path(__file__).resolve().parents[4] / "shared/upstream/chat-templates"
if not TEMPLATES.is_dir():  # a worktree beside the main checkout
    TEMPLATES = Path(__file__).resolve().parents[5] / "shared/upstream/chat-templates"
A1 = '{"arg1": 1}'

DETECTED = {
    "openai-gpt-oss-120b.jinja": "gpt_oss",
    "Qwen3-Coder.jinja": "qwen3_coder",
    "Qwen3.5-4B.jinja": "qwen3_coder",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": "qwen3_coder",
    "StepFun3.5-Flash.jinja": "qwen3_coder",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": "mistral_small",
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": "mistral_small",
    "unsloth-mistral-Devstral-Small-2507.jinja": "mistral_small",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral_nemo",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "deepseek_r1",
    "deepseek-ai-DeepSeek-V3.1.jinja": "deepseek_v3_1",
    "deepseek-ai-DeepSeek-V3.2.jinja": "deepseek_dsml",
    "deepseek-ai-DeepSeek-V4.jinja": "deepseek_dsml",
    "GLM-4.6.jinja": "glm_4_5",
    "GLM-4.7-Flash.jinja": "glm_4_5",
    "Kimi-K2-Instruct.jinja": "kimi_k2",
    "Kimi-K2-Thinking.jinja": "kimi_k2",
    "Kimi-K3.jinja": "kimi_k3",
    "MiniMax-M2.jinja": "minimax_m2",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": "command_r7b",
    "ibm-granite-granite-3.3-2B-Instruct.jinja": "granite",
    "ibm-granite-granite-4.0.jinja": "hermes",
    "meetkai-functionary-medium-v3.1.jinja": "functionary_v3_1",
    "meetkai-functionary-medium-v3.2.jinja": "functionary_v3_2",
    "fireworks-ai-llama-3-firefunction-v2.jinja": "firefunction_v2",
    "LFM2-8B-A1B.jinja": "lfm2",
    "LFM2.5-8B-A1B.jinja": "lfm2",
    "Apertus-8B-Instruct.jinja": "apertus",
    "ByteDance-Seed-OSS.jinja": "seed_oss",
    "NVIDIA-Nemotron-Nano-v2.jinja": "nemotron_v2",
    "unsloth-Apriel-1.5.jinja": "apriel",
    "google-gemma-4-31B-it.jinja": "gemma4",
    "GigaChat3-10B-A1.8B.jinja": "gigachat3",
    "GigaChat3.1-10B-A1.8B.jinja": "gigachat3",
    "openbmb-MiniCPM5-1B.jinja": "minicpm5",
    "HuggingFaceTB-SmolLM3-3B.jinja": "smollm3",
    "MiMo-VL.jinja": "xiaomi_mimo",
    "Qwen-Qwen2.5-7B-Instruct.jinja": "hermes",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3",
    "google-gemma-2-2b-it.jinja": "none",
    "muse-glimmer.jinja": "muse_glimmer",
}


@pytest.mark.skipif(not TEMPLATES.is_dir(), reason="../shared/upstream/chat-templates is absent")
@pytest.mark.parametrize("file, name", DETECTED.items())
def test_detected_from_the_template(file, name):
    assert detect((TEMPLATES / file).read_text(encoding="utf-8")).name == name


# (dialect, output, content, reasoning, [(name, arguments-as-JSON-value, id)])
CASES = [
    ("hermes", 'Hi<tool_call>\n{"name": "f", "arguments": {"arg1": 1}}\n</tool_call>', "Hi", "",
     [("f", {"arg1": 1}, "")]),
    ("llama3", '{"name": "f", "parameters": {"arg1": 1}}', "", "", [("f", {"arg1": 1}, "")]),
    ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=arg1>\n1\n</parameter>\n"
     "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>", "", "",
     [("f", {"arg1": 1, "city": "Paris"}, "")]),
    ("qwen3_coder", "<think>hmm</think>\n<tool_call>\n<function=f>\n</function>\n</tool_call>"
     "<tool_call>\n<function=g>\n<parameter=x>\ny\n</parameter>\n</function>\n</tool_call>",
     "", "hmm", [("f", {}, ""), ("g", {"x": "y"}, "")]),
    ("gpt_oss", "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant"
     "<|channel|>final<|message|>Hello, world!", "Hello, world!", "I'm\nthinking", []),
    ("gpt_oss", "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>"
     "commentary to=functions.f <|constrain|>json<|message|>" + A1 + "<|call|>", "", "think",
     [("f", {"arg1": 1}, "")]),
    ("gpt_oss", "<|channel|>commentary<|message|>Hello", "Hello", "", []),
    ("mistral_nemo", '[TOOL_CALLS][{"name": "f", "arguments": {"arg1": 1}, "id": "123456789"}]',
     "", "", [("f", {"arg1": 1}, "123456789")]),
    ("mistral_small", "[TOOL_CALLS]f[CALL_ID]000000001[ARGS]" + A1 +
     '[TOOL_CALLS]g[CALL_ID]000000002[ARGS]{"arg1": 1, "arg2": 2}', "", "",
     [("f", {"arg1": 1}, "000000001"), ("g", {"arg1": 1, "arg2": 2}, "000000002")]),
    ("mistral_small", "Hello[TOOL_CALLS]f[ARGS]" + A1, "Hello", "", [("f", {"arg1": 1}, "")]),
    ("mistral_small", "[THINK]hmm[/THINK]Hi", "Hi", "hmm", []),
    ("deepseek_r1", "<think>hmm</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
     "<｜tool▁sep｜>f\n```json\n" + A1 + "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "", "hmm",
     [("f", {"arg1": 1}, "")]),
    ("deepseek_v3_1", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>" + A1 +
     "<｜tool▁call▁end｜><｜tool▁call▁begin｜>g<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     "", "", [("f", {"arg1": 1}, ""), ("g", {}, "")]),
    ("deepseek_dsml", '<｜DSML｜function_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter '
     'name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="n" '
     'string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>', "", "",
     [("f", {"city": "Paris", "n": 2}, "")]),
    ("glm_4_5", "<tool_call>f\n<arg_key>arg1</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
     "", "", [("f", {"arg1": 1}, "")]),
    ("glm_4_5", "<tool_call>f<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
     "", "", [("f", {"city": "Paris"}, "")]),
    ("kimi_k2", "<think>hmm</think><|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
     "<|tool_call_argument_begin|>" + A1 + "<|tool_call_end|><|tool_calls_section_end|>", "",
     "hmm", [("f", {"arg1": 1}, "functions.f:0")]),
    ("kimi_k3", "hmm<|close|>think<|sep|><|open|>response<|sep|>Let me look.<|close|>response"
     '<|sep|><|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|><|open|>argument '
     'key="city" type="string"<|sep|>Paris<|close|>argument<|sep|><|open|>argument key="n" '
     'type="number"<|sep|>2<|close|>argument<|sep|><|close|>call<|sep|><|open|>call tool="g" '
     'index="2"<|sep|><|open|>json type="object"<|sep|>{"q": "a&b"}<|close|>json<|sep|>'
     "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>", "Let me look.", "hmm",
     [("f", {"city": "Paris", "n": 2}, ""), ("g", {"q": "a&b"}, "")]),
    ("minimax_m2", '<think>hmm</think>\n<minimax:tool_call>\n<invoke name="f">\n<parameter '
     'name="arg1">1</parameter>\n</invoke>\n<invoke name="g">\n</invoke>\n</minimax:tool_call>',
     "", "hmm", [("f", {"arg1": 1}, ""), ("g", {}, "")]),
    ("command_r7b", "<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_ACTION|>[\n"
     '    {"tool_call_id": "0", "tool_name": "f", "parameters": {"arg1": 1}}\n]<|END_ACTION|>',
     "", "I'm\nthinking", [("f", {"arg1": 1}, "0")]),
    ("command_r7b", "<|START_RESPONSE|>Hello, world!<|END_RESPONSE|>", "Hello, world!", "", []),
    ("granite", '<|tool_call|>[{"name": "f", "arguments": {"arg1": 1}}]', "", "",
     [("f", {"arg1": 1}, "")]),
    ("functionary_v3_1", "<function=f>" + A1 + "</function>", "", "", [("f", {"arg1": 1}, "")]),
    ("functionary_v3_2", "f\n" + A1, "", "", [("f", {"arg1": 1}, "")]),
    ("functionary_v3_2", "all\nHello, world!", "Hello, world!", "", []),
    ("firefunction_v2", ' functools[{"name": "f", "arguments": {"arg1": 1}}]', "", "",
     [("f", {"arg1": 1}, "")]),
    ("lfm2", "<think>I'm\nthinking</think><|tool_call_start|>[f(arg1=1)]<|tool_call_end|>", "",
     "I'm\nthinking", [("f", {"arg1": 1}, "")]),
    ("apertus", '<|tools_prefix|>[{"f": {"arg1": 1}}]<|tools_suffix|>', "", "",
     [("f", {"arg1": 1}, "")]),
    ("seed_oss", "<seed:think>hmm</seed:think><seed:tool_call>\n<function=f>\n<parameter=arg1>1"
     "</parameter>\n</function>\n</seed:tool_call>", "", "hmm", [("f", {"arg1": 1}, "")]),
    ("nemotron_v2", 'I\'m\nthinking\n</think>\n<TOOLCALL>[{"name": "f", "arguments": '
     '{"arg1": 1}}]</TOOLCALL>', "", "I'm\nthinking", [("f", {"arg1": 1}, "")]),
    # Apriel 1.6's prompt opens the block; its thoughts keep their blanks, as upstream's
    ("apriel", "I'm\nthinking\n[BEGIN FINAL RESPONSE]\nHello", "Hello", "I'm\nthinking\n", []),
    ("apriel", 'Ok.\n[BEGIN FINAL RESPONSE]\n<tool_calls>[{"name": "f", "arguments": {"arg1": 1}}]'
     '</tool_calls>', "", "Ok.\n", [("f", {"arg1": 1}, "")]),
    ("gemma4", "<|channel>thought\nI'm\nthinking<channel|>Hello", "Hello", "I'm\nthinking", []),
    ("gemma4", '<|tool_call>call:f{city:<|"|>Paris<|"|>,n:1}<tool_call|>', "", "",
     [("f", {"city": "Paris", "n": 1}, "")]),
    ("gigachat3", '<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": "f", "arguments": '
     '{"arg1": 1}}', "", "", [("f", {"arg1": 1}, "")]),
    ("minicpm5", '<function name="python"><param name="code">print(1)</param></function>', "", "",
     [("python", {"code": "print(1)"}, "")]),
    # its template renders no tools, and upstream reads no calls from its output
    ("smollm3", '<tool_call>\n{"name": "f", "arguments": {"arg1": 1}}\n</tool_call>',
     '<tool_call>\n{"name": "f", "arguments": {"arg1": 1}}\n</tool_call>', "", []),
    ("xiaomi_mimo", '<tool_call>\n{"name": "f", "arguments": {"arg1": 1}}\n</tool_call>', "", "",
     [("f", {"arg1": 1}, "")]),
    ("none", "<tool_call>x</tool_call>", "<tool_call>x</tool_call>", "", []),
    ("muse_glimmer", " to=self<|message|>hmm<|eom|><|start|>assistant to=user<|message|>Hi"
     "<|eom|><|start|>assistant to=f<|message|><atem:function_calls>\n<atem:invoke name=\"f\">\n"
     '<atem:parameter name="arg1">1</atem:parameter>\n<atem:parameter name="s">a\nb</atem:parameter>'
     "\n</atem:invoke>\n</atem:function_calls><|eom|><|start|>assistant to=g<|message|>"
     "<atem:function_calls>\n<atem:invoke name=\"g\">\n</atem:invoke>\n</atem:function_calls>",
     "Hi", "hmm", [("f", {"arg1": 1, "s": "a\nb"}, ""), ("g", {}, "")]),
]

THINKING_OPEN = {"nemotron_v2", "kimi_k3", "apriel"}  # the template opens the block in the prompt


def _parse(name, text, partial=False):
    return parse(name, text, partial=partial, thinking_open=name in THINKING_OPEN)


@pytest.mark.parametrize("name, text, content, reasoning, calls", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_full_parse(name, text, content, reasoning, calls):
    got = _parse(name, text)
    assert (got.content, got.reasoning_content) == (content, reasoning)
    assert [(c.name, json.loads(c.arguments), c.id) for c in got.tool_calls] == calls


@pytest.mark.parametrize("name, text, content, reasoning, calls", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_every_prefix_is_a_prefix_of_the_final_parse(name, text, content, reasoning, calls):
    final = _parse(name, text)
    for n in range(len(text) + 1):
        part = _parse(name, text[:n], partial=True)
        where = f"after {text[:n]!r}"
        assert final.content.startswith(part.content), where
        # upstream's partials keep the thoughts' blanks, which the final parse trims
        assert final.reasoning_content.startswith(part.reasoning_content.strip()), where
        assert len(part.tool_calls) <= len(final.tool_calls), where
        for p, f in zip(part.tool_calls, final.tool_calls):
            assert p.name == f.name and p.id in ("", f.id), where
            assert f.arguments.startswith(p.arguments), where


@pytest.mark.parametrize("name, text", [
    ("qwen3_coder", "<tool_call>\nnot a call</tool_call>"),
    ("mistral_small", "[TOOL_CALLS] oops, no call"),
    ("kimi_k2", "<|tool_calls_section_begin|>garbage"),
    ("deepseek_v3_1", "<｜tool▁calls▁begin｜>nothing here"),
    ("glm_4_5", "<tool_call>bad name here</tool_call>"),
    ("kimi_k3", '<|open|>tools<|sep|><|open|>call index="1"<|sep|><|close|>call<|sep|>'
     '<|close|>tools<|sep|>'),
    ("muse_glimmer", " to=f<|message|>no block here"),
])
def test_malformed_calls_are_content(name, text, caplog):
    got = parse(name, text)
    assert got.tool_calls == () and got.content == text
    assert any("returned as content" in r.getMessage() for r in caplog.records)


def test_every_contract_dialect_is_in_the_table():
    names = ("hermes llama3 qwen3_coder gpt_oss mistral_nemo mistral_small deepseek_r1 "
             "deepseek_v3_1 deepseek_dsml glm_4_5 kimi_k2 kimi_k3 minimax_m2 functionary_v3_1 "
             "functionary_v3_2 firefunction_v2 command_r7b granite lfm2 apertus seed_oss "
             "nemotron_v2 apriel gemma4 gigachat3 minicpm5 smollm3 xiaomi_mimo muse_glimmer generic none")
    assert set(names.split()) <= set(BY_NAME)


M3 = "]<]minimax[>["
PLAN = [{"type": "function", "function": {"name": "plan", "parameters": {"type": "object", "properties": {
    "title": {"type": "string"},
    "place": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}}},
    "tags": {"type": "array", "items": {"type": "string"}},
    "stops": {"type": "array", "items": {"type": "object", "properties": {
        "n": {"type": "integer"}, "ok": {"type": "boolean"}}}}}}}}]


def _m3(tag: str, value: str) -> str:
    return f"{M3}<{tag}>{value}{M3}</{tag}>"


M3_PLAN = (f'{M3}<tool_call>\n{M3}<invoke name="plan">' + _m3("title", "Trip")
           + _m3("place", _m3("city", "Paris") + _m3("zip", "75001"))
           + _m3("tags", _m3("item", "a b") + _m3("item", "c"))
           + _m3("stops", _m3("item", _m3("n", "1") + _m3("ok", "true")))
           + f"{M3}</invoke>\n{M3}</tool_call>")


@pytest.mark.parametrize("cut, arguments", [
    # upstream's parser (build 10587) on these prefixes of the same output
    (M3_PLAN.index("<place>") + 7, '{"title":"Trip","place":{'),
    (M3_PLAN.index("</city>") - len(M3) - 2, '{"title":"Trip","place":{"city":"Par'),
    (M3_PLAN.index("<tags>") + 6, '{"title":"Trip","place":{"city":"Paris","zip":75001},"tags":['),
    (M3_PLAN.index("a b") + 2, '{"title":"Trip","place":{"city":"Paris","zip":75001},"tags":["a '),
    (M3_PLAN.index("</tags>") + 7,
     '{"title":"Trip","place":{"city":"Paris","zip":75001},"tags":["a b","c"]'),
    (M3_PLAN.index("<ok>") + 7,
     '{"title":"Trip","place":{"city":"Paris","zip":75001},"tags":["a b","c"],"stops":[{"n":1,"ok":tru'),
])
def test_minimax_m3_nested_parameters_stream_as_upstreams(cut, arguments):
    (call,) = parse("minimax_m3", M3_PLAN[:cut], partial=True, tools=PLAN).tool_calls
    assert call.arguments == arguments


def test_minimax_m3_nested_parameters_are_read_by_their_schema():
    (call,) = parse("minimax_m3", M3_PLAN, tools=PLAN).tool_calls
    assert json.loads(call.arguments) == {"title": "Trip", "place": {"city": "Paris", "zip": 75001},
                                          "tags": ["a b", "c"], "stops": [{"n": 1, "ok": True}]}


def test_muse_glimmer_keeps_a_call_before_a_message_it_cannot_read():
    """A later message upstream cannot read leaves the calls already streamed
    standing; the unreadable rest is content at the end."""
    tools = [{"type": "function", "function": {"name": "f"}}]
    text = (' to=f<|message|><atem:function_calls>\n<atem:invoke name="f">\n</atem:invoke>\n'
            "</atem:function_calls><|eom|><|start|>assistant to=g<|message|>oops")
    for partial in (True, False):
        got = parse("muse_glimmer", text, partial=partial, tools=tools)
        assert [(c.name, c.arguments) for c in got.tool_calls] == [("f", "{}")]
    assert parse("muse_glimmer", text, tools=tools).content == " to=g<|message|>oops"

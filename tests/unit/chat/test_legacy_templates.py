"""chat/legacy.py against llama.cpp's legacy formatter at the pinned build.

The data (legacy_templates.json) are upstream facts: the conversation of
its tests/test-chat-template.cpp, the prompt every built-in name writes for
it, the template texts that file feeds to detection with the prompt it
expects, and the format detection picks for each template of the upstream
collection.  Every comparison is byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlxcel_trio.chat import legacy

_DATA = json.loads((Path(__file__).parent / "legacy_templates.json").read_text("utf-8"))
_CONVERSATION = [tuple(t) for t in _DATA["conversation"]]
_HELP = Path(__file__).parents[4] / "shared" / "upstream" / "llama-server" / "help.txt"
_COLLECTION = Path(__file__).parents[4] / "shared" / "upstream" / "chat-templates"


def test_the_names_are_upstreams():
    assert list(legacy.BUILTIN_NAMES) == sorted(_DATA["by_name"])
    assert len(legacy.BUILTIN_NAMES) == 54
    assert "dots1" in legacy.FORMATS and "dots1" not in legacy.BUILTIN_NAMES


@pytest.mark.skipif(not _HELP.exists(), reason="the upstream facts are not beside the checkout")
def test_the_names_are_the_ones_help_lists():
    help_text = _HELP.read_text("utf-8")
    listed = help_text.split("list of built-in templates:", 1)[1].split("(env:", 1)[0]
    assert [w.strip(",") for w in listed.split()] == list(legacy.BUILTIN_NAMES)


@pytest.mark.parametrize("name", sorted(_DATA["by_name"]))
def test_every_name_renders_as_upstream(name):
    with_gen, without_gen = _DATA["by_name"][name]
    assert legacy.render(name, _CONVERSATION, True) == with_gen
    assert legacy.render(name, _CONVERSATION, False) == without_gen
    assert legacy.detect(name) == name


def test_a_detected_only_format():
    entry = _DATA["detected_only"]["dots1"]
    assert legacy.detect(entry["template"]) == "dots1"
    assert legacy.render("dots1", _CONVERSATION, True) == entry["outputs"][0]
    assert legacy.render("dots1", _CONVERSATION, False) == entry["outputs"][1]


@pytest.mark.parametrize("case", _DATA["cases"], ids=[c["model"] for c in _DATA["cases"]])
def test_template_text_is_detected_and_rendered_as_upstream(case):
    name = legacy.detect(case["template"])
    assert name is not None
    chat = _CONVERSATION + [tuple(t) for t in case["extra"]]
    assert legacy.render(name, chat, True) == case["expected"]


@pytest.mark.parametrize("text, name", [
    ("{{ '<|im_start|>' }}", "chatml"),
    ("<|im_start|><|im_sep|>", "phi4"),
    ("<|im_start|><end_of_utterance>", "smolvlm"),
    ("mistral anything", "llama2"),
    ("[INST] <<SYS>>", "llama2-sys"),
    ("[INST] {{ bos_token + '[INST] ' }} <<SYS>>", "llama2-sys-bos"),
    ("[INST] {{ content.strip() }}", "llama2-sys-strip"),
    ("[INST][SYSTEM_PROMPT]", "mistral-v7"),
    ("[AVAILABLE_TOOLS] [INST]", "mistral-v1"),
    ('[AVAILABLE_TOOLS]"[INST]"', "mistral-v3-tekken"),
    ("[AVAILABLE_TOOLS][INST]", "mistral-v3"),
    ("<|assistant|><|user|><|tool_declare|>", "exaone-moe"),
    ("<|assistant|><|user|></s>", "falcon3"),
    ("<|assistant|><|user|>", "glmedge"),
    ("<|user|><|endoftext|>", "zephyr"),
    ("[|system|][|assistant|][|endofturn|][|tool|]", "exaone4"),
    ("[|system|][|assistant|][|endofturn|]", "exaone3"),
    ("rwkv-world", "rwkv-world"),
    ("<|start_of_role|>", "granite"),
    ("<|start_of_role|><tools>g4_default_system_message", "granite-4.0"),
    ("<|start_of_role|><tool_call>", "granite-4.1"),
    ("<role>ASSISTANT</role>\"HUMAN\"<think>", "bailing-think"),
    ("<role>ASSISTANT</role><role>HUMAN</role><|role_end|>", "bailing2"),
    ("<|header_start|><|header_end|>", "llama4"),
    ("<|extra_0|><|extra_4|>", "hunyuan-moe"),
    ("<|start|><|channel|>", "gpt-oss"),
    ("<｜hy_Assistant｜><｜hy_begin▁of▁sentence｜>", "hunyuan-vl"),
    ("<｜hy_Assistant｜><｜hy_place▁holder▁no▁3｜>", "hunyuan-dense"),
    ("<|im_assistant|>assistant<|im_middle|>", "kimi-k2"),
    ("'Assistant: '  + message['content'] + '<|separator|>'", "grok-2"),
    ("[unused9]系统：[unused10]", "pangu-embedded"),
    ("<|begin|><|end|><|content|>", "solar-open"),
    ("<｜Assistant｜><｜User｜><｜end▁of▁sentence｜>", "deepseek3"),
])
def test_detection_rules(text, name):
    assert legacy.detect(text) == name


@pytest.mark.parametrize("text", ["", "hello", "{{ messages }}", " chatml", "llama3\n"])
def test_unknown_text_is_not_detected(text):
    # a name must match whole: surrounding blanks make it template text
    assert legacy.detect(text) is None


@pytest.mark.skipif(not _COLLECTION.is_dir(), reason="the upstream collection is not beside the checkout")
@pytest.mark.parametrize("file", sorted(_DATA["collection"]))
def test_the_collection_detects_as_upstream(file):
    text = (_COLLECTION / file).read_text("utf-8")
    assert legacy.detect(text) == _DATA["collection"][file]


def test_turns_join_text_parts_as_upstream():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                         {"type": "text", "text": "b"}]},
            {"role": "user", "content": [{"type": "text", "text": ""},
                                         {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "x"}]},
            {"role": "assistant", "content": "ok", "reasoning_content": "hmm"}]
    # an empty first part adds no newline: one is written only after text
    assert legacy.turns(msgs) == [("user", "a\nb"), ("user", "b"), ("assistant", ""),
                                  ("assistant", "ok")]


def test_rwkv_opens_the_reply_after_a_final_user_turn_regardless():
    assert legacy.render("rwkv-world", [("user", "hi")], False) == "User: hi\n\nAssistant:"

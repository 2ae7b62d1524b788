"""server/request/chat_legacy.py: a chat body on the legacy path (--no-jinja,
or a built-in format named) -> the prompt in the built-in format, with
llama-server's refusals, wording and status."""

from __future__ import annotations

import pytest

from mlxcel_trio.chat.settings import build
from mlxcel_trio.config import ServerConfig
from mlxcel_trio.engine.vocab import Vocab
from mlxcel_trio.server.http.errors import ApiError
from mlxcel_trio.server.request.chat import plan

SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "Hi"}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def vocab(tiny_model):
    return Vocab(tiny_model)


@pytest.fixture(scope="module")
def no_jinja(vocab):
    return build(ServerConfig(model="x", chat_jinja=False), vocab)


@pytest.fixture(scope="module")
def llama3(vocab):
    return build(ServerConfig(model="x", chat_template="llama3"), vocab)


def refused(body, settings, vocab) -> tuple[int, str, str]:
    with pytest.raises(ApiError) as info:
        plan(body, settings, vocab)
    return info.value.status, info.value.type, info.value.message


def test_the_fixture_template_is_formatted_as_chatml(no_jinja, vocab):
    assert no_jinja.legacy == "chatml"
    p = plan({"messages": [SYSTEM, USER]}, no_jinja, vocab)
    assert p.prompt == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi"
                        "<|im_end|>\n<|im_start|>assistant\n")
    assert p.tokens == vocab.tokenize(p.prompt, False, True)
    assert p.syntax.skip and p.syntax.tool_format is None and p.tools == ()
    assert p.budget == -1 and not p.control and not p.thinking_open


def test_a_named_format(llama3, vocab):
    p = plan({"messages": [SYSTEM, USER]}, llama3, vocab)
    assert p.prompt == ("<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_tools_are_refused_with_upstreams_words_and_status(no_jinja, vocab):
    assert refused({"messages": [USER], "tools": TOOLS}, no_jinja, vocab) == \
        (400, "invalid_request_error", "tools param requires --jinja flag")
    for choice in ("none", "required", "bogus"):
        assert refused({"messages": [USER], "tool_choice": choice}, no_jinja, vocab) == \
            (400, "invalid_request_error", "tool_choice param requires --jinja flag")
    # checked before anything else in the body, as upstream
    assert refused({"tools": TOOLS}, no_jinja, vocab)[2] == "tools param requires --jinja flag"
    # what upstream lets through: no tools, "auto", or a tool_choice that is not a string
    for body in ({"tools": []}, {"tool_choice": "auto"}, {"tool_choice": {"type": "x"}},
                 {"tool_choice": None}):
        assert plan({"messages": [USER], **body}, no_jinja, vocab).tools == ()


def test_tools_under_a_named_format_name_what_to_do(llama3, vocab):
    status, kind, message = refused({"messages": [USER], "tools": TOOLS}, llama3, vocab)
    assert (status, kind) == (400, "invalid_request_error")
    assert message.startswith("tools param requires a Jinja chat template")
    assert "--chat-template-file" in message


def test_content_parts_are_joined_by_newlines(no_jinja, vocab):
    parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": "the best book"}]
    p = plan({"messages": [{"role": "user", "content": parts}]}, no_jinja, vocab)
    assert "<|im_start|>user\nWhat is\nthe best book<|im_end|>" in p.prompt


def test_a_trailing_assistant_message_is_written_whole(no_jinja, vocab):
    body = {"messages": [USER, {"role": "assistant", "content": "Sure,"}]}
    p = plan(body, no_jinja, vocab)
    assert p.prompt.endswith("<|im_start|>assistant\nSure,<|im_end|>\n")
    assert p.prefill == "" and not p.echo
    assert refused({**body, "add_generation_prompt": True, "continue_final_message": True},
                   no_jinja, vocab)[2] == \
        "Cannot set both add_generation_prompt and continue_final_message to true."
    two = {"messages": [USER, {"role": "assistant", "content": "a"},
                        {"role": "assistant", "content": "b"}]}
    assert refused(two, no_jinja, vocab)[2] == \
        "Cannot have 2 or more assistant messages at the end of the list."


def test_add_generation_prompt_false(no_jinja, vocab):
    p = plan({"messages": [USER], "add_generation_prompt": False}, no_jinja, vocab)
    assert p.prompt == "<|im_start|>user\nHi<|im_end|>\n"


def test_tool_calls_and_reasoning_are_not_part_of_the_format(no_jinja, vocab):
    msgs = [USER, {"role": "assistant", "content": None, "reasoning_content": "hmm",
                   "tool_calls": [{"id": "c", "type": "function",
                                   "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "content": "42", "tool_call_id": "c"}]
    p = plan({"messages": msgs}, no_jinja, vocab)
    assert p.prompt == ("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
                        "<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n")


def test_shared_checks_keep_their_words(no_jinja, vocab):
    assert refused({}, no_jinja, vocab)[2] == "'messages' is required"
    assert refused({"messages": [USER], "reasoning_format": "x"}, no_jinja, vocab)[2] == \
        "Unknown reasoning format: x"
    bad = {"messages": [USER], "chat_template_kwargs": {"enable_thinking": "yes"}}
    assert "enable_thinking" in refused(bad, no_jinja, vocab)[2]


def test_response_format_and_budget_fields_pass_through(no_jinja, vocab):
    body = {"messages": [USER], "response_format": {"type": "json_object"},
            "reasoning_budget_tokens": 5, "logprobs": True, "top_logprobs": 2}
    p = plan(body, no_jinja, vocab)
    assert p.native["json_schema"] == {} and p.native["n_probs"] == 2
    # no thinking markers on this path: the native fields are the body's own
    assert p.native["reasoning_budget_tokens"] == 5 and "logprobs" not in p.native


def test_an_unrecognised_template_fails_each_request(vocab):
    vocab_unknown = type("V", (), {"chat_template": "{{ messages }}",
                                   "chat_template_tool_use": None,
                                   "special_tokens_map": {},
                                   "tokenize": vocab.tokenize})
    settings = build(ServerConfig(model="x", chat_jinja=False), vocab_unknown)
    assert refused({"messages": [USER]}, settings, vocab) == \
        (500, "server_error", "this custom template is not supported, try using --jinja")


def test_upstreams_server_test_for_a_named_format(vocab):
    # llama.cpp's own server suite (--no-jinja by default) asks for this prompt
    settings = build(ServerConfig(model="x", chat_jinja=False, chat_template="command-r"), vocab)
    body = {"messages": [{"role": "system", "content": "You are a test."},
                         {"role": "user", "content": "Hi there"}]}
    assert plan(body, settings, vocab, generating=False).prompt == (
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>"
        "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")

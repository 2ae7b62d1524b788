"""server/request/chat.py: a chat body -> prompt, syntax, prefill; every
malformed request refused with llama-server's wording and status."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from mlxcel_trio.chat.settings import build
from mlxcel_trio.config import ServerConfig
from mlxcel_trio.engine.vocab import Vocab
from mlxcel_trio.chat.parser import parse
from mlxcel_trio.server.request.chat import plan
from mlxcel_trio.server.http.errors import ApiError

USER = {"role": "user", "content": "Hi"}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def vocab(tiny_model):
    return Vocab(tiny_model)


@pytest.fixture(scope="module")
def settings(vocab):
    return build(ServerConfig(model="x"), vocab)


def refused(body, settings, vocab) -> tuple[int, str]:
    with pytest.raises(ApiError) as info:
        plan(body, settings, vocab)
    return info.value.status, info.value.message


def test_plain_render_and_tokens(settings, vocab):
    p = plan({"messages": [USER]}, settings, vocab)
    assert p.prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert p.tokens == vocab.tokenize(p.prompt, False, True)
    # read in the template's dialect, with no calls: the request offered no tools
    assert not p.syntax.thinking_open and p.syntax.tool_format.name == "hermes"
    assert not p.syntax.calls and p.prefill == "" and not p.stream


def test_enable_thinking_false_closes_the_block(settings, vocab):
    p = plan({"messages": [USER], "chat_template_kwargs": {"enable_thinking": False}},
             settings, vocab)
    assert p.prompt.endswith("<think>\n\n</think>\n\n") and not p.syntax.thinking_open
    # the parser learns the prompt closed an empty block: a block the model writes is content
    assert p.syntax.closed_think and p.syntax.opener == "<think>\n\n</think>\n\n"
    assert parse("<think>x</think>Hi", p.syntax, False).content == "<think>x</think>Hi"
    p = plan({"messages": [USER], "reasoning_effort": "none"}, settings, vocab)
    assert p.prompt.endswith("</think>\n\n") and p.syntax.closed_think
    assert not plan({"messages": [USER]}, settings, vocab).syntax.closed_think


def test_tools_render_and_turn_parsing_on(settings, vocab):
    p = plan({"messages": [USER], "tools": TOOLS}, settings, vocab)
    assert "<tools>" in p.prompt and p.syntax.tool_format.name == "hermes" and p.syntax.calls
    p = plan({"messages": [USER], "tools": TOOLS, "tool_choice": "none"}, settings, vocab)
    assert "<tools>" not in p.prompt and not p.syntax.calls
    p = plan({"messages": [USER], "tools": []}, settings, vocab)
    assert "<tools>" not in p.prompt
    p = plan({"messages": [USER], "tools": TOOLS, "tool_choice": {"type": "other"}},
             settings, vocab)
    assert p.syntax.calls and p.prefill == ""  # upstream: "auto"


def test_required_and_named_choices_open_the_call(settings, vocab):
    # a reasoning budget of 0: no thinking first, the call's opening is prefilled
    now = {"messages": [USER], "tools": TOOLS, "reasoning_budget_tokens": 0}
    p = plan({**now, "tool_choice": "required"}, settings, vocab)
    assert p.prompt.endswith("<|im_start|>assistant\n<tool_call>\n") and not p.echo
    for choice in ({"type": "function", "function": {"name": "f"}},
                   {"type": "function", "name": "f"}):
        p = plan({**now, "tool_choice": choice}, settings, vocab)
        assert p.prefill == '<tool_call>\n{"name": "f", "arguments": '
        assert p.prompt.endswith("assistant\n" + p.prefill)
    status, message = refused({"messages": [USER], "tools": TOOLS, "tool_choice": {
        "type": "function", "function": {"name": "g"}}}, settings, vocab)
    assert status == 400 and "'g'" in message
    llama = attrs.evolve(settings, tool_format="llama3")
    p = plan({**now, "tool_choice": "required"}, llama, vocab)
    assert p.prefill == '{"name": "'
    unknown = attrs.evolve(settings, tool_format=None)
    assert refused({"messages": [USER], "tools": TOOLS, "tool_choice": "required"},
                   unknown, vocab)[0] == 400
    assert plan({"messages": [USER], "tools": TOOLS, "tool_choice": "required"}, unknown,
                vocab, generating=False).prefill == ""


def test_a_forced_call_may_think_first(settings, vocab):
    """Reasoning allowed (the default budget): nothing is prefilled; the
    grammar takes an optional thinking block, then the call's opening."""
    p = plan({"messages": [USER], "tools": TOOLS, "tool_choice": "required"}, settings, vocab)
    assert p.prefill == "" and p.prompt.endswith("<|im_start|>assistant\n")
    assert p.tool_grammar.startswith("start: (") and "<tool_call>" in p.tool_grammar
    off = plan({"messages": [USER], "tools": TOOLS, "tool_choice": "required",
                "chat_template_kwargs": {"enable_thinking": False}}, settings, vocab)
    assert off.prefill == "<tool_call>\n"  # the prompt closed the block: the call at once


def test_prefill_continues_the_last_assistant_message(settings, vocab):
    body = {"messages": [USER, {"role": "assistant", "content": "<think>\nHmm"}]}
    p = plan(body, settings, vocab)
    assert p.prompt.endswith("<|im_start|>assistant\n<think>\nHmm")
    assert p.prefill == "<think>\nHmm" and not p.echo
    no_prefill = attrs.evolve(settings, prefill_assistant=False)
    p = plan(body, no_prefill, vocab)
    assert p.prompt.endswith("Hmm<|im_end|>\n<|im_start|>assistant\n") and p.prefill == ""
    p = plan({**body, "continue_final_message": True, "add_generation_prompt": False},
             no_prefill, vocab)
    assert p.prefill == "<think>\nHmm"


def test_a_prefill_of_text_parts_joins_them_with_a_blank_line(settings, vocab):
    # upstream renders the continued message's parts with "\n\n" between them
    # (render_content), not the "\n" it flattens other messages' parts with
    parts = [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]
    p = plan({"messages": [USER, {"role": "assistant", "content": parts}]}, settings, vocab)
    assert p.prefill == "Wh\n\nill" and p.prompt.endswith("<|im_start|>assistant\nWh\n\nill")
    flat = attrs.evolve(settings, typed_content=False)
    p = plan({"messages": [{"role": "user", "content": parts}]}, flat, vocab)
    assert "user\nWh\nill<|im_end|>" in p.prompt


def test_reasoning_only_prefill_needs_a_primed_block(settings, vocab):
    body = {"messages": [USER, {"role": "assistant", "content": "",
                                "reasoning_content": "hmm"}]}
    status, message = refused(body, settings, vocab)
    assert status == 400 and "reasoning_content" in message


@pytest.mark.parametrize("body, status, message", [
    ({}, 400, "'messages' is required"),
    ({"messages": {}}, 400, "Expected 'messages' to be an array"),
    ({"messages": ["hi"]}, 400, "All non-assistant messages must contain 'content'"),
    ({"messages": [{"role": "user"}]}, 400, "All non-assistant messages must contain 'content'"),
    ({"messages": [{"role": "assistant"}]}, 400,
     "Assistant message must contain either 'content' or 'tool_calls'!"),
    ({"messages": [{"role": "user", "content": 5}]}, 400,
     "Expected 'content' to be a string or an array"),
    ({"messages": [{"role": "user", "content": [{"type": "audio"}]}]}, 400,
     "unsupported content[].type"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400,
     "image input is not supported - hint: if this is unexpected, you may need to provide "
     "the mmproj"),
    ({"messages": [{"content": "x"}]}, 400,
     'Failed to parse messages: Missing \'role\' in message: {"content":"x"}'),
    ({"messages": [{"role": 3, "content": "x"}]}, 400,
     "Failed to parse messages: [json.exception.type_error.302] type must be string, but is "
     "number"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}, 400,
     "Failed to parse messages: [json.exception.type_error.302] type must be string, but is "
     "number"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]}, 400,
     'Failed to parse messages: Missing tool call type: {"function":{}}'),
    ({"messages": [USER, {"role": "assistant", "content": "a"},
                   {"role": "assistant", "content": "b"}]}, 400,
     "Cannot have 2 or more assistant messages at the end of the list."),
    ({"messages": [USER], "continue_final_message": True}, 400,
     "Cannot set both add_generation_prompt and continue_final_message to true."),
    ({"messages": [USER], "tool_choice": "sometimes"}, 400, "Invalid tool_choice: sometimes"),
    ({"messages": [USER], "tools": {"a": 1}}, 400,
     'Failed to parse tools: Expected \'tools\' to be an array, got {"a":1}; tools = {\n  "a": 1\n}'),
    ({"messages": [USER], "tools": [{"function": {}}]}, 400,
     'Failed to parse tools: Missing tool type: {"function":{}}; tools = [\n  {\n    '
     '"function": {}\n  }\n]'),
    ({"messages": [USER], "reasoning_format": "loud"}, 400, "Unknown reasoning format: loud"),
    ({"messages": [USER], "chat_template_kwargs": {"enable_thinking": "no"}}, 400,
     'invalid type for "enable_thinking" (expected boolean, got string)'),
    ({"messages": [USER], "response_format": {"type": "yaml"}}, 400,
     'response_format type must be one of "text" or "json_object", but got: yaml'),
    ({"messages": [USER], "top_logprobs": 2}, 400,
     "top_logprobs requires logprobs to be set to true"),
    ({"messages": [USER], "json_schema": {}, "grammar": "root ::= x"}, 400,
     "Cannot use both json_schema and grammar"),
    ({"messages": [USER], "tools": TOOLS, "grammar": "root ::= x"}, 400,
     "Cannot use custom grammar constraints with tools."),
])
def test_upstream_wording(body, status, message, settings, vocab):
    assert refused(body, settings, vocab) == (status, message)


@pytest.mark.parametrize("fmt, schema", [
    ({"type": "json_object"}, {}),
    ({"type": "json_object", "schema": {"type": "integer"}}, {"type": "integer"}),
    ({"type": "json_schema", "json_schema": {"name": "n", "schema": {"enum": ["a"]}}},
     {"enum": ["a"]}),
    ({"type": "json_schema"}, {}),
    # a schema that is no schema goes on as sent, to be refused where it is
    # converted (upstream: a 400), not replaced by "any JSON"
    ({"type": "json_object", "schema": 123}, 123),
    ({"type": "json_schema", "json_schema": {"schema": "x"}}, "x"),
    ({"type": "json_object", "schema": None}, {}),
])
def test_response_format_becomes_a_json_schema(fmt, schema, settings, vocab):
    p = plan({"messages": [USER], "response_format": fmt}, settings, vocab)
    assert p.native["json_schema"] == schema
    assert "json_schema" not in plan({"messages": [USER], "response_format": {"type": "text"}},
                                     settings, vocab).native


def test_a_template_that_raises_is_a_400(settings, vocab):
    from mlxcel_trio.chat.template import ChatTemplate
    raising = attrs.evolve(settings, template=ChatTemplate("{{ raise_exception('no system') }}"))
    assert refused({"messages": [USER]}, raising, vocab) == (400, "no system")


def test_prompt_only_routes_do_not_refuse_decoding_fields(settings, vocab):
    body = {"messages": [USER], "tools": TOOLS, "logprobs": True,
            "response_format": {"type": "json_object"}}
    assert plan(body, settings, vocab, generating=False).prompt.startswith("<|im_start|>system")
    assert refused({"messages": [USER], "top_logprobs": 1}, settings, vocab)[0] == 400


def test_reasoning_kwargs_get_upstreams_synonyms(settings, vocab):
    from mlxcel_trio.chat.template import ChatTemplate
    probe = attrs.evolve(settings, template=ChatTemplate(
        "{{ preserve_thinking }} {{ clear_thinking }} {{ drop_thinking }} "
        "{{ truncate_history_thinking }} {{ reasoning_effort }} {{ reasoning_strength }}"))
    p = plan({"messages": [USER], "reasoning_effort": "high",
              "chat_template_kwargs": {"preserve_reasoning": True}}, probe, vocab)
    assert p.prompt == "True False False False high high"


def test_parts_are_joined_for_a_string_only_template(settings, vocab):
    from mlxcel_trio.chat.template import ChatTemplate
    strict = attrs.evolve(settings, typed_content=False, template=ChatTemplate(
        "{% for m in messages %}{% if m.content is string %}[{{ m.content }}]{% endif %}"
        "{% endfor %}"))
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                      {"type": "text", "text": "b"}]}]}
    assert plan(body, strict, vocab).prompt == "[a\nb]"
    assert "ab" in plan(body, settings, vocab).prompt  # the fixture template takes parts


def test_logprobs_become_n_probs(settings, vocab):
    assert plan({"messages": [USER], "logprobs": True}, settings, vocab).native["n_probs"] == 20
    p = plan({"messages": [USER], "logprobs": True, "top_logprobs": 3}, settings, vocab)
    assert p.native["n_probs"] == 3 and "logprobs" not in p.native
    assert refused({"messages": [USER], "logprobs": True, "tools": TOOLS, "stream": True},
                   settings, vocab) == (400, "logprobs is not supported with tools + stream")


def test_forced_call_grammars_compile_and_accept_a_call():
    """The lark a required / named tool_choice adds: the tool's schema for the
    arguments, then the close; a name needing JSON escapes stays one literal."""
    import llguidance as llg

    from mlxcel_trio.server.request.chat import tool_call_grammar

    tools = [{"type": "function", "function": {"name": 'odd"name', "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}},
        {"type": "function", "function": {"name": "plain"}}]
    for choice, name, fmt in (("required", None, "hermes"), ("named", "plain", "hermes"),
                              ("required", None, "llama3"), ("named", 'odd"name', "llama3")):
        lark = tool_call_grammar(choice, name, tools, fmt)
        assert llg.LLMatcher.validate_grammar(llg.LLMatcher.grammar_from_lark(lark)) in ("", None)
    assert tool_call_grammar("auto", None, tools, "hermes") is None
    assert tool_call_grammar("required", None, tools, None) is None
    assert '"{\\"name\\": \\"odd\\\\\\"name\\", \\"arguments\\": "' in \
        tool_call_grammar("required", None, tools, "hermes")


TEMPLATES = Path(__file__).resolve().parents[4] / "shared/upstream/chat-templates"
if not TEMPLATES.is_dir():  # a worktree beside the main checkout
    TEMPLATES = Path(__file__).resolve().parents[5] / "shared/upstream/chat-templates"
# family template, kwargs that let it think -> a reasoning block, then its call
THINKING = {
    "Qwen-Qwen3-0.6B.jinja": ({}, "<think>hmm</think>\n\n<tool_call>\n"
                              '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    "openai-gpt-oss-120b.jinja": ({}, "<|channel|>analysis<|message|>hmm<|end|><|start|>assistant"
                                  "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                                  '<|message|>{"city": "Paris"}'),
    "deepseek-ai-DeepSeek-V3.1.jinja": ({"thinking": True}, "hmm</think><｜tool▁calls▁begin｜>"
                                        "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
                                        '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'),
    "GLM-4.6.jinja": ({}, "<think>hmm</think><tool_call>get_weather\n<arg_key>city</arg_key>\n"
                      "<arg_value>Paris</arg_value>\n</tool_call>"),
    "GLM-4.7-Flash.jinja": ({}, "hmm</think><tool_call>get_weather<arg_key>city</arg_key>"
                             "<arg_value>Paris</arg_value></tool_call>"),
    "Kimi-K2-Thinking.jinja": ({}, "<think>hmm</think><|tool_calls_section_begin|>"
                               "<|tool_call_begin|>functions.get_weather:0"
                               '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
                               "<|tool_calls_section_end|>"),
    "muse-glimmer.jinja": ({}, " to=self<|message|>hmm<|eom|><|start|>assistant to=get_weather"
                           '<|message|><atem:function_calls>\n<atem:invoke name="get_weather">\n'
                           '<atem:parameter name="city">Paris</atem:parameter>\n</atem:invoke>\n'
                           "</atem:function_calls>"),
    "MiniMax-M2.jinja": ({}, 'hmm</think>\n\n<minimax:tool_call>\n<invoke name="get_weather">\n'
                         '<parameter name="city">Paris</parameter>\n</invoke>\n</minimax:tool_call>'),
}
WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                              "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.mark.parametrize("name", sorted(THINKING))
def test_a_forced_call_comes_after_the_reasoning_block(name, vocab):
    """With reasoning allowed, a required call is forced once the reasoning
    block closes (as vLLM forces it): nothing is prefilled, the grammar takes
    thoughts, the close, then the family's call, and the parse gives both;
    a reasoning budget of 0 opens the call at once, as before."""
    import llguidance as llg

    from mlxcel_trio.chat.dialects import lookup
    from mlxcel_trio.chat.parser import ChatStream

    path = TEMPLATES / name
    if not path.exists():
        pytest.skip("../shared/upstream/chat-templates is absent")
    kwargs, output = THINKING[name]
    settings = build(ServerConfig(model="x", chat_template_file=str(path)), vocab)
    body = {"messages": [USER], "tools": WEATHER, "tool_choice": "required",
            "parallel_tool_calls": False, "chat_template_kwargs": kwargs}
    p = plan(body, settings, vocab)
    assert p.prefill == "" and p.tool_grammar
    tok = llg.LLTokenizer(vocab.tokenizer_json(), n_vocab=vocab.n_vocab)
    m = llg.LLMatcher(tok, llg.LLMatcher.grammar_from_lark(p.tool_grammar), log_level=0)
    # the thinking markers as the vocabulary's own tokens; the call character
    # by character (the call grammars spell their markers as text, which
    # llguidance writes in pieces)
    cut = output.index(lookup(settings.tool_format).opener(None))
    tokens = vocab.tokenize(output[:cut]) + [t for ch in output[cut:] for t in vocab.tokenize(ch)]
    assert all(m.consume_token(t) for t in tokens) and m.is_accepting(), m.get_error()
    m = llg.LLMatcher(tok, llg.LLMatcher.grammar_from_lark(p.tool_grammar), log_level=0)
    stray = "hmm" + settings.think_end + "\nhello"  # no free text after the block
    assert not all(m.consume_token(t) for t in vocab.tokenize(stray)) or m.is_error()
    stream = ChatStream(p.syntax, p.prefill, False)
    stream.update(output, final=True)
    msg = stream.msg
    assert msg.reasoning_content == "hmm" and not msg.content
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == \
        [("get_weather", {"city": "Paris"})]
    now = plan({**body, "reasoning_budget_tokens": 0}, settings, vocab)
    assert now.prefill and now.prompt.endswith(now.prefill)


def test_minimax_m3_forces_nested_parameters_as_elements(vocab):
    """A forced MiniMax M3 call writes an object or list parameter as the
    template's nested elements (which is how its parser reads it back)."""
    import llguidance as llg

    from mlxcel_trio.chat.parser import ChatStream

    path = TEMPLATES / "MiniMax-M3.jinja"
    if not path.exists():
        pytest.skip("../shared/upstream/chat-templates is absent")
    from tests.unit.chat.test_dialects import M3_PLAN, PLAN
    settings = build(ServerConfig(model="x", chat_template_file=str(path)), vocab)
    tools = [{"type": "function", "function": {**PLAN[0]["function"], "description": "Plan"}}]
    p = plan({"messages": [USER], "tools": tools, "tool_choice": "required",
              "parallel_tool_calls": False, "reasoning_budget_tokens": 0}, settings, vocab)
    head, rest = M3_PLAN.split('<invoke name="', 1)  # the opening is prefilled
    assert p.prefill.endswith(head.split("<tool_call>")[-1] + '<invoke name="')
    tok = llg.LLTokenizer(vocab.tokenizer_json(), n_vocab=vocab.n_vocab)
    m = llg.LLMatcher(tok, llg.LLMatcher.grammar_from_lark(p.tool_grammar), log_level=0)
    assert all(m.consume_token(t) for ch in rest for t in vocab.tokenize(ch)) and m.is_accepting(), \
        m.get_error()
    stream = ChatStream(p.syntax, p.prefill, False)
    stream.update(rest, final=True)
    (call,) = stream.msg.tool_calls
    assert json.loads(call.arguments)["stops"] == [{"n": 1, "ok": True}]

"""chat/parser.py on fixed model outputs: placement for every reasoning
format, tool calls in both formats, and the streaming invariant (the deltas
of any split concatenate to the final message)."""

from __future__ import annotations

import json
import random

import pytest

from mlxcel_trio.chat.parser import ChatMsg, ChatStream, Syntax, ToolCall, parse

THOUGHT = "<think>\nLet me add.\n2 plus 2 is 4.\n</think>\n\nThe answer is 4."
PRIMED = "Let me add.\n</think>\n\nThe answer is 4."
FORMATS = ("none", "deepseek", "deepseek-legacy", "auto")


def final(text, **kw) -> ChatMsg:
    return parse(text, Syntax(**kw), partial=False)


@pytest.mark.parametrize("fmt, content, reasoning", [
    ("none", THOUGHT, ""),
    ("deepseek", "The answer is 4.", "Let me add.\n2 plus 2 is 4."),
    ("auto", "The answer is 4.", "Let me add.\n2 plus 2 is 4."),
    ("deepseek-legacy", "<think>\nLet me add.\n2 plus 2 is 4.\n</think>\n\nThe answer is 4.",
     "Let me add.\n2 plus 2 is 4."),
])
def test_reasoning_placement(fmt, content, reasoning):
    msg = final(THOUGHT, reasoning_format=fmt)
    assert (msg.content, msg.reasoning_content, msg.tool_calls) == (content, reasoning, ())


@pytest.mark.parametrize("fmt, content, reasoning", [
    ("none", PRIMED, ""),
    ("deepseek", "The answer is 4.", "Let me add."),
    ("deepseek-legacy", "<think>" + PRIMED, "Let me add."),
])
def test_primed_thinking_block(fmt, content, reasoning):
    msg = final(PRIMED, reasoning_format=fmt, thinking_open=True)
    assert (msg.content, msg.reasoning_content) == (content, reasoning)


def test_unclosed_thoughts_are_all_reasoning():
    msg = final("<think>still going", reasoning_format="deepseek")
    assert (msg.content, msg.reasoning_content) == ("", "still going")


def test_no_thinking_block_is_plain_content():
    for fmt in FORMATS:
        assert final("Hello <think>x</think>", reasoning_format=fmt).content == \
            "Hello <think>x</think>"


def test_skip_parsing_keeps_everything():
    text = THOUGHT + '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    msg = final(text, skip=True, tool_format="hermes")
    assert msg == ChatMsg(content=text)


HERMES_TWO = ('I will check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
              '\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET", '
              '"fmt": "a \\"b\\" }"}}\n</tool_call>')


def test_hermes_parallel_calls():
    msg = final(HERMES_TWO, tool_format="hermes")
    assert msg.content == "I will check.\n"  # upstream keeps text's blanks before a call
    assert msg.tool_calls == (
        ToolCall("get_weather", '{"city": "Paris"}'),
        ToolCall("get_time", '{"tz": "CET", "fmt": "a \\"b\\" }"}'),
    )
    assert json.loads(msg.tool_calls[1].arguments)["fmt"] == 'a "b" }'


def test_hermes_after_thoughts_and_not_inside_them():
    text = ('<think>maybe <tool_call>{"name": "x", "arguments": {}}</tool_call></think>'
            '<tool_call>{"name": "y", "arguments": {"a": 1}}</tool_call>')
    msg = final(text, tool_format="hermes", reasoning_format="deepseek")
    assert [c.name for c in msg.tool_calls] == ["y"]
    assert "<tool_call>" in msg.reasoning_content and msg.content == ""


def test_tool_markup_is_content_without_tools():
    assert final(HERMES_TWO).content == HERMES_TWO


@pytest.mark.parametrize("text", [
    "<tool_call>not json</tool_call> ok",
    '<tool_call>{"arguments": {}}</tool_call> ok',
    "see <tool_call>",
])
def test_hermes_invalid_calls_stay_content(text):
    msg = final(text, tool_format="hermes")
    assert msg.tool_calls == () and msg.content == text


def test_hermes_string_arguments_and_missing_arguments():
    msg = final('<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>'
                '<tool_call>{"name": "b"}</tool_call>', tool_format="hermes")
    assert msg.tool_calls == (ToolCall("a", '{"x": 1}'), ToolCall("b", "{}"))


def test_truncated_call_is_still_a_call():
    msg = final('<tool_call>{"name": "a", "arguments": {"x": [1, 2', tool_format="hermes")
    assert msg.tool_calls == (ToolCall("a", '{"x": [1, 2'),) and msg.content == ""


def test_llama3_json_calls():
    msg = final('{"name": "get_weather", "parameters": {"city": "Paris"}}', tool_format="llama3")
    assert msg == ChatMsg(tool_calls=(ToolCall("get_weather", '{"city": "Paris"}'),))
    two = final('<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": '
                '{"n": 2}}', tool_format="llama3")
    assert [(c.name, c.arguments) for c in two.tool_calls] == [("a", "{}"), ("b", '{"n": 2}')]
    assert final("Paris is sunny.", tool_format="llama3").content == "Paris is sunny."
    assert final('{"answer": 4}', tool_format="llama3").content == '{"answer": 4}'


# -- streaming -------------------------------------------------------------------------

def _splits(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 40))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def _replay(text: str, syntax: Syntax, pieces, prefix="", echo=False):
    stream = ChatStream(syntax, prefix, echo)
    diffs = []
    for piece in pieces:
        diffs += stream.update(piece)
    diffs += stream.finish()
    return stream.msg, diffs


CASES = [
    (THOUGHT, {}),
    (PRIMED, {"thinking_open": True}),
    (HERMES_TWO, {"tool_format": "hermes"}),
    (THOUGHT + "\n" + HERMES_TWO, {"tool_format": "hermes"}),
    ('{"name": "a", "parameters": {"q": "x y"}}; {"name": "b", "parameters": {}}',
     {"tool_format": "llama3"}),
    ("  plain text with <thin and </think> and <tool_call bits ", {"tool_format": "hermes"}),
    ("<think>unclosed </thi", {}),
    ('<tool_call>{"name": "a", "arguments": {"x": "trunc', {"tool_format": "hermes"}),
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("text, kw", CASES)
def test_any_split_concatenates_to_the_final_message(fmt, text, kw):
    syntax = Syntax(reasoning_format=fmt, **kw)
    expect = parse(text, syntax, partial=False)
    rng = random.Random(hash((fmt, text)) & 0xFFFF)
    for trial in range(25):
        pieces = list(text) if trial == 0 else _splits(text, rng)
        msg, diffs = _replay(text, syntax, pieces)
        assert "".join(d.content for d in diffs) == expect.content
        assert "".join(d.reasoning_content for d in diffs) == expect.reasoning_content
        assert [c.name for c in msg.tool_calls] == [c.name for c in expect.tool_calls]
        for k, call in enumerate(expect.tool_calls):
            parts = [d for d in diffs if d.tool_index == k]
            assert parts[0].tool_name == call.name and parts[0].tool_id
            assert all(not d.tool_name for d in parts[1:])
            assert "".join(d.tool_arguments for d in parts) == call.arguments


def test_a_call_is_never_streamed_as_content():
    syntax = Syntax(tool_format="hermes")
    _, diffs = _replay(HERMES_TWO, syntax, list(HERMES_TWO))
    streamed = "".join(d.content for d in diffs)
    assert "tool_call" not in streamed and "get_weather" not in streamed


def test_prefill_is_left_out_unless_echoed():
    syntax = Syntax(reasoning_format="deepseek")
    msg, _ = _replay("", syntax, ["more thoughts</think>Answer"], prefix="<think>Some ")
    assert (msg.reasoning_content, msg.content) == (" more thoughts", "Answer")
    msg, _ = _replay("", syntax, ["more thoughts</think>Answer"], prefix="<think>Some ",
                     echo=True)
    assert (msg.reasoning_content, msg.content) == ("Some more thoughts", "Answer")
    msg, _ = _replay("", Syntax(), [" world"], prefix="Hello")
    assert msg.content == " world"


def test_tool_call_ids_are_stable_and_distinct():
    stream = ChatStream(Syntax(tool_format="hermes"))
    for ch in HERMES_TWO:
        stream.update(ch)
    first = [c.id for c in stream.msg.tool_calls]
    stream.finish()
    assert [c.id for c in stream.msg.tool_calls] == first
    assert len(set(first)) == 2 and all(len(i) == 32 for i in first)


def test_a_broken_call_ends_where_it_breaks():
    text = '<tool_call>{"name": "a", "arguments": {"x": 1} garbage here'
    msg = final(text, tool_format="hermes")
    assert msg.tool_calls == (ToolCall("a", '{"x": 1}'),) and msg.content == ""
    _, diffs = _replay(text, Syntax(tool_format="hermes"), list(text))
    assert "".join(d.content for d in diffs) == ""


def test_a_prefill_that_opens_a_call_is_reported_whole():
    syntax = Syntax(tool_format="hermes")
    prefix = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    msg, diffs = _replay("", syntax, ['is"}}', "\n</tool_call>"], prefix=prefix)
    assert msg.content == ""
    assert [(c.name, c.arguments) for c in msg.tool_calls] == [("get_weather", '{"city": "Paris"}')]
    assert diffs[0].tool_name == "get_weather"
    closed = prefix + 'is"}}\n</tool_call>\n'
    msg, _ = _replay("", syntax, ["Done."], prefix=closed)
    assert msg.tool_calls == () and msg.content == "Done."


def test_a_recipient_line_without_tools_is_not_streamed_as_a_call():
    """Functionary v3.2 reads its `name\\n{...}` lines with no tools offered;
    a plain first line that ends before any argument must not stream out as
    a call (upstream's test_completion_without_tool_call_slow, streamed)."""
    from mlxcel_trio.chat.dialects import syntax_for

    text = 'we will tell ball. I tell out user):\n}}\n. I will tell kite\n'
    stream = ChatStream(syntax_for("functionary_v3_2", reasoning_format="auto",
                                   thinking_open=False, tools=None))
    diffs = [d for ch in text for d in stream.update(ch)] + stream.finish()
    assert not [d for d in diffs if d.tool_index is not None or d.tool_name]
    assert "".join(d.content for d in diffs) == text

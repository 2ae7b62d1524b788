"""The trained fixture (fixtures/trained/) on a real server: behaviour a
random checkpoint cannot show.  Prompts come from a seed no training sample
used (fixtures.trained_corpus.held_out); all decoding is greedy.

The thresholds are the trained model's acceptance bars: chat answers stop at
EOS in the template's shape (>= 90 %), a request needing a tool gets a
parsable Hermes call under `tool_choice: auto` (>= 80 %) and the turn after
the result is text, thinking opens and closes <think>, and the polite-style
adapter (answers open with "Sure!" and close with "Have a nice day!")
changes style at scale 1 (>= 90 %), equals the base at scale 0 and
gives the same text in a mixed batch as alone.

Served with the Qwen3-Coder template instead (`--jinja --chat-template-file`,
the template the corpus renders its second family with), the same model
writes that family's XML calls, `<function=NAME>` and `<parameter=KEY>`
blocks, under `tool_choice: auto` (>= 80 %); the OpenAI SDK gets them
parsed, raw and streamed alike, and after the result the answer is text.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from fixtures import trained_corpus as corpus

from .sse import post

pytestmark = pytest.mark.e2e

CHAT = "/v1/chat/completions"
N = 20


@pytest.fixture(scope="module")
def trained(start_server):
    from fixtures.build import ensure

    # the adapter loaded at scale 0: the base model unless a request asks
    srv = start_server(ensure("trained"), "-c", "8192", "-np", "4",
                       "--lora-scaled", f"{ensure('trained-lora')}:0")
    yield srv
    srv.stop()


def _chat(srv, messages, **extra) -> dict:
    r = post(srv.url, {"messages": messages, "max_tokens": 200, "temperature": 0.0, **extra},
             path=CHAT, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _first_turn(chat: corpus.Chat) -> list[dict]:
    return [m for m in chat.messages if m["role"] in ("system", "user")][:2]


def _many(fn, items):
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(fn, items))


def test_chat_answers_stop_at_eos_in_the_templates_shape(trained):
    prompts = [_first_turn(c) for c in corpus.held_out(n=N)]
    outs = _many(lambda m: _chat(trained, m), prompts)
    good = [o for o in outs if o["finish_reason"] == "stop" and o["message"]["content"].strip()
            and "<think>" not in o["message"]["content"]
            and "<|im_start|>" not in o["message"]["content"]]
    assert len(good) >= 0.9 * N, [o["message"]["content"][:80] for o in outs]


def test_thinking_opens_and_closes_the_block(trained):
    chats = corpus.held_out(seed=777_002, n=8)
    raw = _many(lambda c: _chat(trained, _first_turn(c), reasoning_format="none"), chats)
    closed = [o["message"]["content"] for o in raw]
    assert all(t.startswith("<think>") and "</think>" in t for t in closed), closed
    parsed = _chat(trained, _first_turn(chats[0]))["message"]
    assert parsed.get("reasoning_content") and "</think>" not in parsed["content"], parsed


def test_a_request_needing_a_tool_gets_a_parsable_call_then_a_text_answer(trained):
    chats = corpus.held_out(seed=777_003, n=N, tool_share=1.0)

    def call(chat):
        out = _chat(trained, _first_turn(chat), tools=chat.tools, tool_choice="auto")
        return chat, out

    parsed = []
    for chat, out in _many(call, chats):
        calls = out["message"].get("tool_calls") or []
        if out["finish_reason"] == "tool_calls" and calls:
            fn = calls[0]["function"]
            args = json.loads(fn["arguments"])
            offered = {t["function"]["name"] for t in chat.tools}
            if fn["name"] in offered and isinstance(args, dict):
                parsed.append((chat, out["message"], calls[0]))
    assert len(parsed) >= 0.8 * N, len(parsed)

    # after the tool's result the model answers in text
    chat, message, first = parsed[0]
    follow = _first_turn(chat) + [
        {"role": "assistant", "content": message.get("content") or "", "tool_calls": [first]},
        {"role": "tool", "tool_call_id": first["id"], "content": json.dumps({"result": 42})}]
    out = _chat(trained, follow, tools=chat.tools, tool_choice="auto")
    assert out["finish_reason"] == "stop" and not out["message"].get("tool_calls"), out
    assert out["message"]["content"].strip(), out


def _lora(srv, messages, scale):
    return _chat(srv, messages, lora=[{"id": 0, "scale": scale}],
                 chat_template_kwargs={"enable_thinking": False})["message"]["content"]


def test_the_adapter_changes_style_at_scale_1_and_is_the_base_at_0(trained):
    prompts = [_first_turn(c) for c in corpus.held_out(seed=777_004, n=N)]
    base = _many(lambda m: _chat(trained, m, chat_template_kwargs={"enable_thinking": False})
                 ["message"]["content"], prompts)
    off = _many(lambda m: _lora(trained, m, 0.0), prompts)
    on = _many(lambda m: _lora(trained, m, 1.0), prompts)
    assert off == base
    styled = [a for a, b in zip(on, base) if a != b and a.startswith(corpus.POLITE_OPEN.strip())
              and a.endswith(corpus.POLITE_CLOSE.strip())]
    assert len(styled) >= 0.9 * N, on
    assert not any(b.startswith(corpus.POLITE_OPEN.strip()) for b in base)


def test_mixed_adapter_scales_in_one_batch_equal_their_solo_runs(trained):
    prompts = [_first_turn(c) for c in corpus.held_out(seed=777_005, n=4)]
    jobs = [(m, s) for m in prompts for s in (0.0, 1.0)]
    solo = [_lora(trained, m, s) for m, s in jobs]
    together = _many(lambda job: _lora(trained, *job), jobs)
    assert together == solo
    assert any(a != b for a, b in zip(solo[::2], solo[1::2]))


# ---- the second family: Qwen3-Coder's template and XML calls -----------------

@pytest.fixture(scope="module")
def coder(start_server):
    from fixtures.build import ensure

    srv = start_server(ensure("trained"), "-c", "8192", "-np", "4", "--jinja",
                       "--chat-template-file", str(corpus.CODER_TEMPLATE))
    yield srv
    srv.stop()


def _coder_call(client, chat, **extra):
    return client.chat.completions.create(
        model="m", messages=_first_turn(chat), tools=chat.tools, tool_choice="auto",
        temperature=0, max_tokens=200, **extra)


def test_the_coder_template_gets_xml_calls_parsed_then_a_text_answer(coder):
    client = openai.OpenAI(base_url=coder.url + "/v1", api_key="x", max_retries=0)
    chats = corpus.held_out_coder(n=N)
    outs = _many(lambda c: _coder_call(client, c).choices[0], chats)
    parsed = []
    for chat, out in zip(chats, outs):
        calls = out.message.tool_calls or []
        offered = {t["function"]["name"] for t in chat.tools}
        if out.finish_reason == "tool_calls" and calls and calls[0].function.name in offered \
                and isinstance(json.loads(calls[0].function.arguments), dict):
            parsed.append((chat, calls[0]))
    assert len(parsed) >= 0.8 * N, [(o.message.content, o.message.tool_calls) for o in outs]

    # the model wrote the family's own XML, not Hermes JSON
    chat, call = parsed[0]
    raw = _coder_call(client, chat, extra_body={"parse_tool_calls": False}).choices[0]
    text = raw.message.content or ""
    assert f"<function={call.function.name}>" in text and "</parameter>" in text, text
    assert '{"name"' not in text, text

    # streamed: the deltas assemble to the same call, none of it as content
    for chat, call in parsed[:3]:
        chunks = list(_coder_call(client, chat, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        parts = [tc for d in deltas for tc in (d.tool_calls or [])]
        assert not "".join(d.content or "" for d in deltas).strip(), deltas
        assert parts and parts[0].function.name == call.function.name
        assert json.loads("".join(p.function.arguments or "" for p in parts)) == \
            json.loads(call.function.arguments)

    # after the tool's result the model answers in text
    history = _first_turn(chat) + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"result": 42})}]
    answer = client.chat.completions.create(model="m", messages=history, tools=chat.tools,
                                            tool_choice="auto", temperature=0,
                                            max_tokens=200).choices[0]
    assert answer.finish_reason == "stop" and not answer.message.tool_calls, answer
    assert answer.message.content and answer.message.content.strip(), answer

"""The native reasoning_budget_* fields and echo on the raw-prompt routes,
with upstream's semantics for a request that has no chat template.

The random-weight model never writes a thinking opener, so the start tag is
taken from its own greedy output: the piece of its first sampled token.
Counting then starts at that token, and after N more the message and the
first end tag are forced; the greedy run without the fields is the control.
"""

from __future__ import annotations

import json

import httpx
import pytest

from .sse import complete, error, iter_sse_lines, post

pytestmark = pytest.mark.e2e

PROMPT = "The engine of the ship"
BASE = {"prompt": PROMPT, "n_predict": 24, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def opener(server) -> str:
    """The greedy first token's piece, which re-tokenizes to that same token."""
    res = complete(server, **BASE, return_tokens=True)
    first = res["tokens"][0]
    piece = post(server.url, {"tokens": [first]}, path="/detokenize").json()["content"]
    assert post(server.url, {"content": piece, "parse_special": True},
                path="/tokenize").json()["tokens"] == [first]
    return piece


def test_the_budget_forces_message_and_end_tag(server, opener):
    plain = complete(server, **BASE, return_tokens=True)
    pieces = [post(server.url, {"tokens": [t]}, path="/detokenize").json()["content"]
              for t in plain["tokens"][:3]]
    body = {**BASE, "reasoning_budget_tokens": 2, "reasoning_budget_start_tag": opener,
            "reasoning_budget_end_tags": ["</think>", "</alt>"],
            "reasoning_budget_message": " Enough."}
    text = complete(server, **body)["content"]
    # the opener, two counted tokens, then the forced run
    assert text.startswith("".join(pieces) + " Enough.</think>"), text
    assert text != plain["content"]
    # /v1/completions reads the same fields
    v1 = post(server.url, body, path="/v1/completions").json()
    assert v1["choices"][0]["text"] == text
    # the singular alias names one end tag
    alias = {**body, "reasoning_budget_end_tag": "</think>"}
    del alias["reasoning_budget_end_tags"]
    assert complete(server, **alias)["content"] == text
    # an empty message forces the end tag alone
    bare = complete(server, **{**body, "reasoning_budget_message": ""})["content"]
    assert bare.startswith("".join(pieces) + "</think>"), bare


@pytest.mark.parametrize("change", [
    {"reasoning_budget_message": None},       # no message: upstream forces nothing
    {"reasoning_budget_tokens": -1},           # no budget and no control
    {"reasoning_budget_start_tag": None},      # no start tag
    {"reasoning_budget_end_tags": []},         # no end tag
    {"reasoning_budget_end_tags": [""]},       # empty tags are dropped
])
def test_without_a_complete_spec_nothing_is_forced(server, opener, change):
    plain = complete(server, **BASE)["content"]
    body = {**BASE, "reasoning_budget_tokens": 2, "reasoning_budget_start_tag": opener,
            "reasoning_budget_end_tags": ["</think>"], "reasoning_budget_message": " Enough.",
            **change}
    body = {k: v for k, v in body.items() if v is not None}
    assert complete(server, **body)["content"] == plain


def test_a_budget_of_zero_closes_at_the_opener(server, opener):
    text = complete(server, **BASE, reasoning_budget_tokens=0, reasoning_budget_start_tag=opener,
                    reasoning_budget_end_tags="</think>", reasoning_budget_message="")["content"]
    assert text.startswith(opener + "</think>"), text


@pytest.mark.parametrize("body, message", [
    ({"reasoning_budget_end_tags": [1]},
     "Field 'reasoning_budget_end_tags': [json.exception.type_error.302] type must be string, "
     "but is number"),
    ({"reasoning_budget_end_tag": ["</think>"]},
     "Field 'reasoning_budget_end_tag': [json.exception.type_error.302] type must be string, "
     "but is array"),
    ({"reasoning_budget_tokens": -2},
     "Field 'reasoning_budget_tokens': Value must be between -1 <= value <= 2147483647, "
     "but got -2"),
    ({"reasoning_budget_start_tag": 5},
     "Field 'reasoning_budget_start_tag': [json.exception.type_error.302] type must be string, "
     "but is number"),
    ({"reasoning_control": "yes"},
     "Field 'reasoning_control': [json.exception.type_error.302] type must be boolean, "
     "but is string"),
    ({"echo": 1},
     "Field 'echo': [json.exception.type_error.302] type must be boolean, but is number"),
])
def test_malformed_fields_use_upstream_wording(server, body, message):
    assert error(server, **{**BASE, "reasoning_budget_start_tag": "<think>", **body}) == message


def test_echo_is_inert_on_the_raw_route(server):
    plain = complete(server, **BASE)["content"]
    assert complete(server, **BASE, echo=True)["content"] == plain
    assert not plain.startswith(PROMPT)


def test_v1_completions_reasoning_control_by_its_id(server, opener):
    body = {**BASE, "n_predict": 600, "stream": True, "reasoning_control": True,
            "reasoning_budget_start_tag": opener, "reasoning_budget_end_tags": ["</think>"],
            "reasoning_budget_message": " Stop."}
    text, answer = "", None
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", server.url + "/v1/completions", json=body) as r:
            for line in iter_sse_lines(r):
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                text += chunk["choices"][0]["text"]
                if answer is None:
                    answer = post(server.url, {"id": chunk["id"], "action": "reasoning_end"},
                                  path="/v1/chat/completions/control").json()
    assert answer == {"success": True}
    assert " Stop.</think>" in text
    plain = complete(server, **{**BASE, "n_predict": 600})["content"]
    assert "</think>" not in plain

"""Stored responses (mlxcel-only routes, OpenAI's contract) through the
official `openai` SDK: `store`, `previous_response_id` chaining,
`client.responses.retrieve` and `.cancel`, background runs, and per-key
scoping with two API keys.  The chained prompt is checked against the
conversation rendered by hand: the input-token count of the continuation
equals the chat count of the full message list."""

from __future__ import annotations

import time

import openai
import pytest

from tests.conftest import wait_until

from .sse import post

pytestmark = pytest.mark.e2e

GREEDY = {"max_output_tokens": 8, "temperature": 0, "extra_body": {"ignore_eos": True}}
K1, K2 = "key-one-" + "a" * 24, "key-two-" + "b" * 24


@pytest.fixture(scope="module")
def keyed(tiny_model, start_server):
    srv = start_server(tiny_model, "-np", "2", "-c", "2048", "--api-key", f"{K1},{K2}")
    yield srv
    srv.stop()


def sdk(srv, key=K1) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=key, timeout=60, max_retries=0)


def auth(key=K1) -> dict:
    return {"headers": {"Authorization": f"Bearer {key}"}}


def test_retrieve_answers_the_stored_response(keyed):
    with sdk(keyed) as c:
        res = c.responses.create(model="m", input="Hello", **GREEDY)
        got = c.responses.retrieve(res.id)
        assert got.id == res.id and got.status == "completed"
        assert got.output_text == res.output_text and got.usage.output_tokens == 8
        # streamed responses are stored too, under the id the stream announced
        events = list(c.responses.create(model="m", input="Hello", stream=True, **GREEDY))
        rid = events[-1].response.id
        assert c.responses.retrieve(rid).output_text == res.output_text
        # store: false keeps nothing
        gone = c.responses.create(model="m", input="Hello", store=False, **GREEDY)
        with pytest.raises(openai.NotFoundError) as exc:
            c.responses.retrieve(gone.id)
        assert exc.value.body["message"] == f"Response with id '{gone.id}' not found."


def test_previous_response_id_continues_the_conversation(keyed):
    with sdk(keyed) as c:
        first = c.responses.create(model="m", input="Tell me about the engine.",
                                   instructions="Be brief.", **GREEDY)
        second = c.responses.create(model="m", input="And the wheels?",
                                    previous_response_id=first.id, **GREEDY)
        assert second.previous_response_id == first.id
        history = [{"role": "user", "content": "Tell me about the engine."},
                   {"role": "assistant", "content": first.output_text},
                   {"role": "user", "content": "And the wheels?"}]
        # instructions are not carried over; the reply and the new input are
        n = post(keyed.url, {"input": "And the wheels?", "previous_response_id": first.id},
                 path="/v1/responses/input_tokens", **auth()).json()["input_tokens"]
        chat = post(keyed.url, {"messages": history}, path="/v1/chat/completions/input_tokens",
                    **auth()).json()["input_tokens"]
        assert n == chat == second.usage.input_tokens
        # a third turn chains through both
        third = c.responses.create(model="m", input="Thanks.", previous_response_id=second.id,
                                   **GREEDY)
        full = history + [{"role": "assistant", "content": second.output_text},
                          {"role": "user", "content": "Thanks."}]
        assert third.usage.input_tokens == post(
            keyed.url, {"messages": full}, path="/v1/chat/completions/input_tokens",
            **auth()).json()["input_tokens"]
        with pytest.raises(openai.BadRequestError) as exc:
            c.responses.create(model="m", input="x", previous_response_id="resp_nope", **GREEDY)
        assert exc.value.body["message"] == "Previous response with id 'resp_nope' not found."


def test_the_chained_text_is_the_greedy_continuation(keyed):
    with sdk(keyed) as c:
        first = c.responses.create(model="m", input="Hi", **GREEDY)
        second = c.responses.create(model="m", input="More", previous_response_id=first.id,
                                    **GREEDY)
    history = [{"role": "user", "content": "Hi"},
               {"role": "assistant", "content": first.output_text},
               {"role": "user", "content": "More"}]
    prompt = post(keyed.url, {"messages": history}, path="/apply-template", **auth()).json()
    ids = post(keyed.url, {"content": prompt["prompt"], "parse_special": True},
               path="/tokenize", **auth()).json()["tokens"]
    native = post(keyed.url, {"prompt": ids, "n_predict": 8, "temperature": 0,
                              "ignore_eos": True}, **auth()).json()["content"]
    assert second.output_text == native


def test_cancel_follows_openais_contract(keyed):
    with sdk(keyed) as c:
        res = c.responses.create(model="m", input="Hello", **GREEDY)
        with pytest.raises(openai.BadRequestError) as exc:
            c.responses.cancel(res.id)
        assert exc.value.body["message"] == \
            "Only responses created with background=true can be cancelled."
        with pytest.raises(openai.NotFoundError):
            c.responses.cancel("resp_unknown")


def wait_status(c, rid: str, statuses: tuple[str, ...], timeout: float = 60):
    return wait_until(lambda: c.responses.retrieve(rid), f"{rid} in {statuses}", timeout,
                      until=lambda got: got.status in statuses)


def test_background_response_is_polled_and_finishes(keyed):
    with sdk(keyed) as c:
        res = c.responses.create(model="m", input="Hello", background=True, **GREEDY)
        assert res.status in ("queued", "in_progress") and res.background is True
        done = wait_status(c, res.id, ("completed",))
        fg = c.responses.create(model="m", input="Hello", **GREEDY)
        assert done.output_text == fg.output_text
        # a finished background response is answered unchanged by cancel
        assert c.responses.cancel(res.id).status == "completed"
        # and can be continued
        nxt = c.responses.create(model="m", input="Again", previous_response_id=res.id,
                                 **GREEDY)
        assert nxt.status == "completed"


def test_cancel_stops_a_background_response(keyed):
    with sdk(keyed) as c:
        res = c.responses.create(model="m", input="Hello", background=True, temperature=0,
                                 max_output_tokens=1500, extra_body={"ignore_eos": True})
        cancelled = c.responses.cancel(res.id)
        assert cancelled.status == "cancelled" and cancelled.id == res.id
        assert c.responses.retrieve(res.id).status == "cancelled"
        # the slot is free again: a foreground request completes promptly
        t0 = time.monotonic()
        c.responses.create(model="m", input="Hi", **GREEDY)
        assert time.monotonic() - t0 < 30


def test_background_refusals(keyed):
    r = post(keyed.url, {"input": "x", "background": True, "stream": True},
             path="/v1/responses", **auth())
    assert r.status_code == 400
    r = post(keyed.url, {"input": "x", "background": True, "store": False},
             path="/v1/responses", **auth())
    assert r.status_code == 400 and r.json()["error"]["message"] == \
        "'background' requires 'store' to be true"


def test_another_key_cannot_see_a_stored_response(keyed):
    with sdk(keyed, K1) as a, sdk(keyed, K2) as b:
        res = a.responses.create(model="m", input="Hello", **GREEDY)
        with pytest.raises(openai.NotFoundError):
            b.responses.retrieve(res.id)
        with pytest.raises(openai.NotFoundError):
            b.responses.cancel(res.id)
        with pytest.raises(openai.BadRequestError):
            b.responses.create(model="m", input="x", previous_response_id=res.id, **GREEDY)
        assert a.responses.retrieve(res.id).id == res.id

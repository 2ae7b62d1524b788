"""Malformed request bodies against a real server: upstream's errors, no 5xx.

A hypothesis storm sends random bytes, truncated JSON, wrong top-level types,
wrong field types and out-of-range numbers to /completion, /v1/completions,
/tokenize and /detokenize.  Every answer must be a real HTTP response whose
error body is upstream's envelope with `code` equal to the status.

No 5xx is allowed.  Upstream itself answers 500 for an unparseable body
(`[json.exception.parse_error...`, or `out_of_range.406` for a number past a
double) and, on /tokenize and /detokenize, for a value of the wrong type
(`type_error.302`): its exception boundary maps every JSON-library exception
to 500.  We answer the 400 invalid_request_error it meant, with the same
message (issue #7; the status difference is recorded on each route's
manifest entry).

Generations are kept to a token or two: `n_predict` is always present and
small unless it is the field under test, and its bad values are chosen so
none of them wraps into a long valid budget.
"""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import SHARED

from .sse import post, stream_frames

pytestmark = pytest.mark.e2e

ROUTES = ["/completion", "/v1/completions", "/tokenize", "/detokenize"]
COMPLETION_ROUTES = {"/completion", "/v1/completions"}
ERRORS_JSON = SHARED / "upstream" / "llama-server" / "error_messages.json"
FALLBACK_TYPES = {"invalid_request_error": 400, "authentication_error": 401,
                  "permission_error": 403, "not_found_error": 404, "server_error": 500,
                  "not_supported_error": 501, "unavailable_error": 503,
                  "exceed_context_size_error": 400}


def _type_to_status() -> dict[str, int]:
    if ERRORS_JSON.is_file():
        return json.loads(ERRORS_JSON.read_text())["error_body_format"]["type_to_status"]
    return FALLBACK_TYPES


TYPE_TO_STATUS = _type_to_status()


def _reject_constant(name):
    raise ValueError(f"non-standard JSON constant {name} in a response")


def strict_json(text: str):
    """Parse as a strict JSON reader would: no NaN / Infinity."""
    return json.loads(text, parse_constant=_reject_constant)


def check_response(path: str, r: httpx.Response) -> None:
    body = strict_json(r.text)
    if r.status_code < 400:
        assert r.status_code == 200, r.text
        return
    assert set(body) == {"error"}, body
    err = body["error"]
    extra = {"n_prompt_tokens", "n_ctx"} if err.get("type") == "exceed_context_size_error" else set()
    assert set(err) == {"code", "message", "type"} | extra, err
    assert err["code"] == r.status_code, err
    assert TYPE_TO_STATUS[err["type"]] == r.status_code, err
    assert isinstance(err["message"], str) and err["message"], err
    assert r.status_code < 500, (path, err)


# -- strategies -------------------------------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
values = st.recursive(scalars, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=6), kids, max_size=4)),
    max_leaves=10)
non_objects = values.filter(lambda v: not isinstance(v, dict))
# bad-or-tiny budgets: rejected, or wrapping (int32) to 0..3, never a long run
budgets = st.one_of(st.text(max_size=5), st.lists(scalars, max_size=3),
                    st.dictionaries(st.text(max_size=3), scalars, max_size=2), st.booleans(),
                    st.integers(-2**31, -2), st.integers(2**31, 2**32 - 2),
                    st.integers(2**32, 2**32 + 3), st.floats(-2.0**31, -2.0))
numbers = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=False, allow_infinity=False),
                    st.floats(3e38, 1e300), st.floats(-1e300, -3e38))  # past a C++ float
not_bool = st.one_of(numbers, st.text(max_size=4), st.lists(scalars, max_size=2))

COMPLETION_FIELDS = {
    "n_predict": budgets,
    "max_tokens": budgets,
    "stream": not_bool,
    "stop": st.one_of(numbers, st.lists(st.one_of(st.text(max_size=4), numbers),
                                        min_size=1, max_size=4), values),
    "temperature": st.one_of(numbers, st.text(max_size=4), st.lists(scalars, max_size=2)),
    "top_k": st.one_of(numbers, st.text(max_size=3)),
    "top_p": st.one_of(numbers, st.text(max_size=3)),
    "min_p": numbers,
    "seed": st.one_of(numbers, st.text(max_size=3)),
    "prompt": values,
    "id_slot": values,
    "n_probs": numbers,
    "n_cmpl": numbers,
    "response_fields": values,
    "stream_options": values,
    "ignore_eos": not_bool,
}
ids_and_junk = st.lists(st.one_of(st.integers(-5, 2000), st.text(max_size=4), scalars, values),
                        max_size=5)
TOKENIZE_FIELDS = {"content": st.one_of(values, ids_and_junk), "add_special": values,
                   "parse_special": values, "with_pieces": values}
DETOKENIZE_FIELDS = {"tokens": st.one_of(values, ids_and_junk), "content": values}
FIELDS = {"/completion": COMPLETION_FIELDS, "/v1/completions": COMPLETION_FIELDS,
          "/tokenize": TOKENIZE_FIELDS, "/detokenize": DETOKENIZE_FIELDS}


@st.composite
def field_bodies(draw, path: str) -> bytes:
    """A body with one to three fields under test, so that an early
    rejection of one does not hide the others."""
    fields = FIELDS[path]
    names = draw(st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=3, unique=True))
    body = {name: draw(fields[name]) for name in names}
    if path in COMPLETION_ROUTES:
        body.setdefault("prompt", "x")
        if "n_predict" not in body and "max_tokens" not in body:
            body["n_predict"] = 1
        elif "max_tokens" in body and "n_predict" not in body and draw(st.booleans()):
            body["n_predict"] = 1  # shadows max_tokens: the first spelling wins
    return json.dumps(body).encode()


@st.composite
def bad_requests(draw) -> tuple[str, bytes]:
    path = draw(st.sampled_from(ROUTES))
    kind = draw(st.sampled_from(["bytes", "truncated", "top_level", "fields", "fields"]))
    if kind == "bytes":
        return path, draw(st.binary(max_size=48))
    if kind == "top_level":
        return path, json.dumps(draw(non_objects)).encode()
    whole = draw(field_bodies(path))
    if kind == "truncated":
        return path, whole[:draw(st.integers(0, len(whole) - 1))]
    return path, whole


GREEDY = {"prompt": "def main():\n    ", "n_predict": 12, "temperature": 0, "ignore_eos": True}


def test_malformed_bodies_storm(server):
    before = post(server.url, GREEDY)
    assert before.status_code == 200, before.text

    with httpx.Client(base_url=server.url, timeout=60) as client:

        @settings(max_examples=60, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(bad_requests())
        def storm(request):
            path, raw = request
            r = client.post(path, content=raw, headers={"Content-Type": "application/json"})
            check_response(path, r)

        storm()

    after = post(server.url, GREEDY)
    assert after.status_code == 200, after.text
    assert after.json()["content"] == before.json()["content"]


# -- specific cases ---------------------------------------------------------------

def test_n_predict_wraps_like_an_int32(server):
    r = post(server.url, {"prompt": "x", "n_predict": 3000000000})
    assert r.status_code == 400
    assert r.json() == {"error": {
        "code": 400, "type": "invalid_request_error",
        "message": "Field 'n_predict': Value must be between -1 <= value <= 2147483647, "
                   "but got -1294967296"}}


def test_top_k_soft_limit_is_clamped(server):
    r = post(server.url, {"prompt": "x", "n_predict": 1, "top_k": -5})
    assert r.status_code == 200, r.text
    assert r.json()["generation_settings"]["top_k"] == 0


def test_negative_temperature_is_clamped_to_greedy(server, tiny_facts):
    body = {"prompt": tiny_facts["long_prompt"], "n_predict": 12, "ignore_eos": True}
    r = post(server.url, {**body, "temperature": -1, "seed": 5})
    assert r.status_code == 200, r.text
    res = r.json()
    assert res["generation_settings"]["temperature"] == 0.0
    greedy = post(server.url, {**body, "temperature": 0}).json()
    assert res["content"] == greedy["content"]


@pytest.mark.parametrize("path", sorted(COMPLETION_ROUTES))
@pytest.mark.parametrize("raw,kind", [
    (b'[{"prompt": "x"}]', "array"),
    (b'5', "number"),
    (b'"x"', "string"),
    (b'null', "null"),
    (b'true', "boolean"),
])
def test_top_level_non_objects_are_400(server, path, raw, kind):
    r = post(server.url, raw, path=path)
    assert r.status_code == 400
    assert r.json() == {"error": {
        "code": 400, "type": "invalid_request_error",
        "message": f"[json.exception.type_error.306] cannot use value() with {kind}"}}


@pytest.mark.parametrize("prompt", [[1549], [-1], ["a", 99999], [5, 2**40]])
def test_out_of_vocabulary_prompt_ids(server, prompt):
    r = post(server.url, {"prompt": prompt, "n_predict": 1})
    assert r.status_code == 400
    assert r.json()["error"] == {"code": 400, "type": "invalid_request_error",
                                 "message": "Prompt contains invalid tokens"}


@pytest.mark.parametrize("path", ROUTES)
def test_empty_body_is_a_parse_error(server, path):
    r = post(server.url, b"", path=path)
    assert r.status_code == 400
    assert r.json()["error"] == {
        "code": 400, "type": "invalid_request_error",
        "message": "[json.exception.parse_error.101] parse error at line 1, column 1: "
                   "attempting to parse an empty input; check that your input string or "
                   "stream contains the expected JSON"}


@pytest.mark.parametrize("raw,message", [
    (b'{"prompt": "x", "temperature": NaN}',
     "parse error at line 1, column 32: syntax error while parsing value - invalid literal; "
     "last read: 'N'"),
    (b'{"prompt": "x",\n "top_p": Infinity}',
     "parse error at line 2, column 11: syntax error while parsing value - invalid literal; "
     "last read: 'I'"),
    (b'{"prompt": "NaN", "n_predict": -Infinity}',
     "parse error at line 1, column 33: syntax error while parsing value - invalid number; "
     "expected digit after '-'; last read: '-I'"),
])
def test_non_standard_literals_are_parse_errors(server, raw, message):
    r = post(server.url, raw)
    assert r.status_code == 400
    assert r.json()["error"] == {"code": 400, "type": "invalid_request_error",
                                 "message": f"[json.exception.parse_error.101] {message}"}


@pytest.mark.parametrize("number", ["1e400", "-2.5e999", "1" + "0" * 400])
def test_numbers_past_a_double_overflow(server, number):
    r = post(server.url, f'{{"prompt": "x", "n_predict": 1, "top_p": {number}}}'.encode())
    assert r.status_code == 400
    assert r.json()["error"] == {
        "code": 400, "type": "invalid_request_error",
        "message": f"[json.exception.out_of_range.406] number overflow parsing '{number}'"}


@pytest.mark.parametrize("path,raw", [
    ("/completion", b'{"prompt": "a", "n_predict": 1, "stop": ["\\udc00"]}'),
    ("/completion", b'{"prompt": "a", "n_predict": 1, "stop": ["\\ud800"], "stream": true}'),
    ("/v1/completions", b'{"prompt": "\\ud83d", "max_tokens": 1}'),
    ("/tokenize", b'{"content": "x\\ud800y"}'),
    ("/detokenize", b'{"tokens": [1], "\\udfff": 0}'),
])
def test_lone_surrogates_are_parse_errors(server, path, raw):
    # before: a 500 with a Python message, or a stream cut mid-body
    r = post(server.url, raw, path=path)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["message"].startswith("[json.exception.parse_error.101] parse error at line 1, ")
    assert "invalid string: surrogate U+" in err["message"]


def test_valid_surrogate_pairs_still_parse(server):
    r = post(server.url, b'{"content": "\\ud83d\\ude00 and \\\\ud800"}', path="/tokenize")
    assert r.status_code == 200, r.text
    text = post(server.url, {"tokens": r.json()["tokens"]}, path="/detokenize").json()
    assert text == {"content": "😀 and \\ud800"}


def test_float_members_past_float32_serialize_as_null(server):
    # 1e39 is a valid double that becomes inf in a C++ float; nlohmann writes
    # a non-finite number as null, and the body stays strict JSON
    body = {"prompt": "x", "n_predict": 2, "temperature": 1e39, "seed": 1}
    r = post(server.url, body)
    assert r.status_code == 200, r.text
    assert strict_json(r.text)["generation_settings"]["temperature"] is None
    frames, raw = stream_frames(server.url, body)
    for line in raw:
        if line.startswith("data: "):
            strict_json(line[6:])
    assert frames[-1]["generation_settings"]["temperature"] is None

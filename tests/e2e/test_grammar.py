"""Constrained decoding on a real server: every output of a grammar or
JSON-schema request parses (streamed or not, lazy or not), precedence and
errors follow upstream, and the server grammar flags apply by default."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest

from mlxcel_trio.cli.main import prepare
from mlxcel_trio.cli.parser import CliError

from .sse import complete, error, stream_frames

pytestmark = pytest.mark.e2e

SCHEMA = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 999},
    "name": {"type": "string", "maxLength": 10},
    "ok": {"type": "boolean"},
    "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 3}},
    "required": ["id", "name", "ok"], "additionalProperties": False}
GBNF = 'root ::= item ("," item){0,3} "."\nitem ::= [a-z]{1,6} | [0-9]{1,3}'
GBNF_RE = r"([a-z]{1,6}|[0-9]{1,3})(,([a-z]{1,6}|[0-9]{1,3})){0,3}\."
HOT = dict(temperature=1.2, top_k=0, top_p=1.0, min_p=0.0)


def test_every_json_schema_output_validates(server):
    res = complete(server, prompt=["The engine", "Your friend", "x", "{"] * 2, n_predict=300,
                   json_schema=SCHEMA, **HOT)
    for r in res:
        assert r["stop_type"] == "eos", r["content"]
        jsonschema.validate(json.loads(r["content"]), SCHEMA)
        assert r["generation_settings"]["grammar"] == ""  # schemas never become GBNF here


def test_every_gbnf_output_matches(server):
    res = complete(server, prompt=["a", "b", "c", "d"] * 2, n_predict=80, grammar=GBNF, **HOT)
    for r in res:
        assert re.fullmatch(GBNF_RE, r["content"]), r["content"]
        assert r["generation_settings"]["grammar"] == GBNF


def test_streamed_outputs_parse_too(server):
    frames, _ = stream_frames(server.url, dict(prompt="x", n_predict=300, json_schema=SCHEMA,
                                               seed=5, **HOT))
    text = "".join(f["content"] for f in frames)
    jsonschema.validate(json.loads(text), SCHEMA)
    frames, _ = stream_frames(server.url, dict(prompt="x", n_predict=80, grammar=GBNF, seed=6,
                                               **HOT))
    assert re.fullmatch(GBNF_RE, "".join(f["content"] for f in frames))


def test_a_greedy_request_with_a_grammar_is_still_constrained(server):
    r = complete(server, prompt="The engine", n_predict=40, temperature=0,
                 grammar='root ::= "yes" | "no" | "maybe"')
    assert r["content"] in ("yes", "no", "maybe") and r["stop_type"] == "eos"


def test_lazy_grammar_waits_for_its_trigger_token(server):
    # logit_bias makes " g" (300) the greedy first token; it fires the grammar
    r = complete(server, prompt="x", n_predict=40, temperature=0, logit_bias=[[300, 30]],
                 grammar='root ::= " g" "(" [0-9]{1,4} ")"', grammar_lazy=True,
                 grammar_triggers=[{"type": 0, "value": " g", "token": 300}])
    assert re.fullmatch(r" g\([0-9]{1,4}\)", r["content"]), r["content"]
    gs = r["generation_settings"]
    assert gs["grammar_lazy"] is True
    assert gs["grammar_triggers"] == [{"type": 0, "value": " g", "token": 300}]


def test_lazy_grammar_word_and_pattern_triggers(server):
    body = dict(prompt="x", n_predict=40, temperature=0, logit_bias=[[300, 30]],
                grammar='root ::= "g" "=" [0-9]{2}', grammar_lazy=True)
    # " g" is one token: a word trigger naming it must be a preserved token
    word = complete(server, **body, preserved_tokens=[" g"],
                    grammar_triggers=[{"type": 1, "value": " g"}])
    assert word["generation_settings"]["grammar_triggers"] == [
        {"type": 0, "value": " g", "token": 300}]
    assert word["generation_settings"]["preserved_tokens"] == [300]
    # a pattern's first non-empty group is where the grammar starts ("g", not " g")
    pattern = complete(server, **body, grammar_triggers=[{"type": 2, "value": " (g)"}])
    assert re.fullmatch(r" g=[0-9]{2}", pattern["content"]), pattern["content"]
    # no trigger ever fires: the output is unconstrained
    free = complete(server, **{**body, "logit_bias": None},
                    grammar_triggers=[{"type": 2, "value": "never-ever"}])
    assert not re.fullmatch(r"g=[0-9]{2}", free["content"])


def test_precedence_follows_upstreams_code(server):
    constrained = dict(prompt="x", n_predict=30, temperature=0,
                       json_schema={"enum": ["solo"]})
    assert complete(server, **constrained)["content"] == '"solo"'
    # grammar present (even empty): the schema branch is not taken
    free = complete(server, **constrained, grammar="")
    assert free["content"] != '"solo"'
    # a non-string grammar is ignored the same way
    assert complete(server, **constrained, grammar=7)["content"] == free["content"]
    # json_schema under the grammar spelling is GBNF
    assert complete(server, prompt="x", n_predict=9, temperature=0,
                    grammar='root ::= "ab"')["content"] == "ab"


@pytest.mark.parametrize(("body", "message"), [
    ({"grammar": "root ::= nope"},
     "Failed to initialize samplers: failed to parse grammar: Undefined rule identifier 'nope'"),
    ({"grammar": 'root ::= r "x"\nr ::= root "y"'}, "left recursion detected"),
    ({"grammar": 'root ::= "a"{2001}'}, "number of repetitions exceeds sane defaults"),
    ({"grammar": "root ::= " + " | ".join(f'"{i}"' for i in range(40000))},
     "over mlxcel-trio's limit of 262144 bytes (256 KiB)"),
    ({"json_schema": {"type": "object", "properties": {"a": {"type": "string",
                                                             "format": "no-such"}}}},
     "Field 'json_schema': \"json_schema\": "),
    ({"json_schema": "not a schema"}, "Field 'json_schema': \"json_schema\": "),
    ({"grammar": 'root ::= "x"', "grammar_lazy": True, "grammar_triggers": []},
     "Field 'grammar_triggers': Error: no triggers set for lazy grammar!"),
    ({"grammar": 'root ::= "x"', "grammar_triggers": [{"type": 1, "value": " g"}]},
     "Grammar trigger word should be marked as preserved token:  g"),
    ({"grammar": 'root ::= "x"', "grammar_triggers": [{"value": "a"}]},
     "Field 'grammar_triggers': [json.exception.out_of_range.403] key 'type' not found"),
    ({"grammar": 'root ::= "x"', "grammar_lazy": True,
      "grammar_triggers": [{"type": 2, "value": "(unclosed"}]},
     "invalid grammar trigger pattern '(unclosed'"),
    ({"preserved_tokens": [1]}, "Field 'preserved_tokens': [json.exception.type_error.302]"),
])
def test_errors(server, body, message):
    assert message in error(server, prompt="x", n_predict=4, **body)


def test_malformed_json_schema_flags_stop_startup(tiny_model, tmp_path):
    (tmp_path / "bad.json").write_text('{"type": ')
    for argv in (["--json-schema", '{"type": '], ["-jf", str(tmp_path / "bad.json")],
                 ["-jf", str(tmp_path / "missing.json")], ["--grammar-file", "/nonexistent"]):
        with pytest.raises(CliError):
            prepare([*argv, "-m", str(tiny_model)], env={})
    cfg = prepare(["--grammar", "root ::= broken", "-m", str(tiny_model)], env={})
    assert cfg.sampling.grammar == "root ::= broken"  # checked once the vocabulary exists


@pytest.fixture(scope="module")
def schema_server(tiny_model, start_server, tmp_path_factory):
    path = tmp_path_factory.mktemp("schema") / "schema.json"
    path.write_text(json.dumps(SCHEMA))
    return start_server(tiny_model, "-np", "2", "-c", "2048", "-jf", str(path))


def test_the_server_schema_constrains_every_request(schema_server):
    r = complete(schema_server, prompt=["a", "b"], n_predict=300, **HOT)
    for x in r:
        jsonschema.validate(json.loads(x["content"]), SCHEMA)
    # an empty grammar next to a schema leaves the server's schema in force
    kept = complete(schema_server, prompt="a", n_predict=300, grammar="",
                    json_schema={"enum": [1]}, **HOT)
    jsonschema.validate(json.loads(kept["content"]), SCHEMA)
    # the request's own schema replaces it
    own = complete(schema_server, prompt="a", n_predict=20, json_schema={"enum": [1, 2]}, **HOT)
    assert own["content"] in ("1", "2")


@pytest.fixture(scope="module")
def broken_server(tiny_model, start_server):
    return start_server(tiny_model, "-np", "1", "-c", "512", "--grammar", "root ::= missing")


def test_a_broken_server_grammar_is_logged_and_refused_per_request(broken_server):
    assert any("the server grammar (--grammar) cannot be used" in line and
               "Undefined rule identifier 'missing'" in line
               for line in broken_server.stdout + broken_server.stderr)
    assert "Failed to initialize samplers: failed to parse grammar" in error(
        broken_server, prompt="x", n_predict=2)
    ok = complete(broken_server, prompt="x", n_predict=5, grammar='root ::= "ok"')
    assert ok["content"] == "ok"


def test_a_list_of_items_is_a_tuple_array_as_upstream_reads_it(server):
    # upstream's converter reads `items: [...]` (draft 4) as a tuple of exactly
    # those items; the chat route's json_object schema takes it as upstream's test sends it
    fmt = {"type": "json_object", "schema": {"items": [{"type": "integer"},
                                                       {"type": "boolean"}]}}
    for seed in range(4):
        r = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "Write an example"}], "max_tokens": 40,
            "response_format": fmt, "seed": seed, **HOT})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        value = json.loads(choice["message"]["content"])
        assert isinstance(value, list) and len(value) == 2, value
        assert type(value[0]) is int and type(value[1]) is bool, value

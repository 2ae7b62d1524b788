"""grammar/compile.py and constraint.py: JSON schemas, the compile cache,
and one sequence's mask and lazy triggers."""

from __future__ import annotations

import re

import numpy as np
import pytest

from mlxcel_trio.grammar.compile import GrammarError, GrammarSpec, schema_grammar
from mlxcel_trio.grammar.constraint import Triggers, find_trigger

SCHEMA = ('{"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer",'
          ' "minimum": 0}}, "required": ["name", "n"], "additionalProperties": false}')


@pytest.mark.parametrize(("text", "ok"), [
    ('{"name": "x", "n": 3}', True),
    ('{"name":"x","n":3}', True),
    ('{\n  "name": "x",\n\t"n": 0\n}', True),
    ('{"name": "x"}', False),
    ('{"name": "x", "n": -1}', False),
    ('{"name": "x", "n": 1, "extra": 1}', False),
    (' {"name": "x", "n": 3}', False),            # no whitespace before the value
    ('{"name": "x",\n\n\n"n": 3}', False),        # at most two newlines, as upstream
])
def test_json_schema(accepts, text, ok):
    assert accepts(SCHEMA, text, kind="json_schema") is ok


OPEN = ('{"type": "object", "properties": {"ok": {"type": "boolean"}, "sub": {"properties":'
        ' {"a": {"type": "integer"}}}}, "required": ["ok"]}')


@pytest.mark.parametrize(("schema", "text", "ok"), [
    (OPEN, '{"ok": true}', True),
    (OPEN, '{"ok": true, "sub": {"a": 1}}', True),
    (OPEN, '{"ok": true, "extra": 1}', False),     # upstream's default: no other key
    (OPEN, '{"ok": true, "sub": {"a": 1, "b": 2}}', False),
    (OPEN.replace('"required"', '"additionalProperties": true, "required"'),
     '{"ok": true, "extra": 1}', True),
    ('{"type": "object"}', '{"any": 1}', True),    # no properties: any object
])
def test_objects_take_no_unlisted_key_unless_the_schema_allows(accepts, schema, text, ok):
    assert accepts(schema, text, kind="json_schema") is ok


@pytest.mark.parametrize("bad", ['{"type": ', '[1, 2]', '{"type": "object", "format": "nope",'
                                 ' "properties": {"a": {"type": "string", "format": "nope"}}}'])
def test_bad_schemas_are_errors(bad):
    with pytest.raises(GrammarError):
        schema_grammar(bad)


def test_boolean_schemas(accepts):
    assert accepts("true", '{"a": [1]}', kind="json_schema")
    assert accepts("true", '"text"', kind="json_schema")


def test_an_empty_schema_is_an_object(accepts):
    # upstream's converter: `{}` (response_format json_object without a schema)
    # is a JSON object, not any value
    assert accepts("{}", '{"a": [1]}', kind="json_schema")
    assert not accepts("{}", '"text"', kind="json_schema")
    assert not accepts("{}", "[1]", kind="json_schema")


def test_compiled_grammars_are_cached(compiler, monkeypatch):
    lowered: list[GrammarSpec] = []
    lower = compiler.lower
    monkeypatch.setattr(compiler, "lower", lambda spec: lowered.append(spec) or lower(spec))
    a = compiler.compile(GrammarSpec("gbnf", 'root ::= "cached"'))
    b = compiler.compile(GrammarSpec("gbnf", 'root ::= "cached"', lazy=True))
    assert lowered == [a.spec], "the second compile lowered (and compiled) the grammar again"
    assert b.lark is a.lark and b.spec.lazy


def test_surrogate_only_sets(accepts):
    assert accepts('root ::= "a" | [\\uD800]', "a")
    assert accepts('root ::= [^\\uD800-\\uDFFF]', "é")


# -- constraint ------------------------------------------------------------------------------

def allowed(mask) -> set[int]:
    return set(np.flatnonzero(mask[0]).tolist())


def test_the_mask_follows_the_generated_tokens(compiler, vocab):
    g = compiler.compile(GrammarSpec("gbnf", 'root ::= "ab" "c"'))
    prompt = [5, 6, 7]
    c = g.start(len(prompt))
    first = allowed(c.mask_for(prompt))
    a = vocab.tokenize("a", False, False)[0]
    assert a in first and all(vocab.detokenize([t])[:1] == "a" for t in first)
    m = c.mask_for(prompt + [a])
    assert vocab.tokenize("bc", False, False)[0] in allowed(m) or vocab.tokenize(
        "b", False, False)[0] in allowed(m)
    done = c.mask_for(prompt + vocab.tokenize("abc", False, False))
    assert allowed(done) == set(vocab.eos_ids)


def test_an_invalid_token_leaves_only_end_of_generation(compiler, vocab):
    c = compiler.compile(GrammarSpec("gbnf", 'root ::= "a"+')).start(0)
    c.mask_for([])
    assert allowed(c.mask_for(vocab.tokenize("b", False, False))) == set(vocab.eos_ids)
    assert c.failed


def test_find_trigger():
    assert find_trigger(re.compile(r"<tool>"), "say <tool> x") == 4
    assert find_trigger(re.compile(r"say (<tool>)"), "say <tool> x") == 4
    assert find_trigger(re.compile(r"^.*?(\{)$"), 'ok {') == 3
    assert find_trigger(re.compile(r"zz"), "abc") is None


def test_a_lazy_grammar_waits_for_a_word_and_replays_from_its_start(compiler, vocab):
    spec = GrammarSpec("gbnf", 'root ::= "<call>" [0-9]+', lazy=True,
                       triggers=Triggers(patterns=(re.escape("<call>"),)))
    c = compiler.compile(spec).start(0)
    free = vocab.tokenize("hello <ca", False, False)
    assert c.mask_for(free) is None and c.awaiting
    hist = free + vocab.tokenize("ll>", False, False)
    m = c.mask_for(hist)
    assert not c.awaiting and not c.failed
    digits = allowed(m)
    assert digits and all(vocab.detokenize([t]).isdigit() for t in digits)


def test_a_lazy_grammar_starts_on_a_trigger_token(compiler, vocab):
    think = 1539
    spec = GrammarSpec("gbnf", 'root ::= <think> "x"', lazy=True, triggers=Triggers(tokens=(think,)))
    c = compiler.compile(spec).start(0)
    assert c.mask_for(vocab.tokenize("abc", False, False)) is None
    m = c.mask_for(vocab.tokenize("abc", False, False) + [think])
    assert allowed(m) == {vocab.tokenize("x", False, False)[0]}


def test_a_lazy_grammar_without_triggers_never_starts(compiler, vocab):
    c = compiler.compile(GrammarSpec("gbnf", 'root ::= "x"', lazy=True)).start(0)
    assert c.mask_for(vocab.tokenize("anything at all", False, False)) is None


def test_a_trigger_inside_a_token_replays_its_tail_and_keeps_whole_tokens(compiler, vocab):
    think = 1539
    spec = GrammarSpec("gbnf", 'root ::= "ab" <think> [0-9]', lazy=True,
                       triggers=Triggers(patterns=("(ab)",)))
    c = compiler.compile(spec).start(0)
    xab = vocab.tokenize("xab", False, False)
    m = c.mask_for(xab + [think])
    assert not c.failed and not c.awaiting
    digits = allowed(m)
    assert digits and all(vocab.detokenize([t]).isdigit() for t in digits)

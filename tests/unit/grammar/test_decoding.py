"""Constrained decoding through the scheduler (no HTTP): whatever the
sampler draws, the text parses."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from mlxcel_trio.protocol.records import Finished, Job, SamplingParams
from mlxcel_trio.grammar.compile import GrammarSpec
from tests.unit.engine.test_scheduler import of, run as drain

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    "n": {"type": "integer", "minimum": -5, "maximum": 500}},
    "required": ["name", "tags", "n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def model(tiny_model):
    from mlx_lm.utils import load_model
    return load_model(tiny_model)[0]


def run(model, vocab, jobs, slots=4):
    from mlxcel_trio.engine.scheduler import Scheduler
    s = Scheduler(model, vocab, n_slots=slots, n_ctx_slot=512, batch_size=64)
    out: list = []
    for j in jobs:
        s.submit(j, out)
    fins = {e.job_id: e for e in of(drain(s, out, limit=5000), Finished)}
    return [fins[j.id] for j in jobs]


def test_json_schema_outputs_validate(model, vocab, compiler):
    g = compiler.compile(GrammarSpec("json_schema", json.dumps(SCHEMA)))
    jobs = [Job(i, (5, 6, 7), n_predict=200, grammar=g,
                sampling=SamplingParams(seed=i, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0))
            for i in range(6)]
    for fin in run(model, vocab, jobs):
        assert fin.stop_type == "eos", fin.content
        jsonschema.validate(json.loads(fin.content), SCHEMA)


def test_gbnf_outputs_match(model, vocab, compiler):
    src = 'root ::= "(" [a-z]{1,8} ("," [a-z]{1,8}){0,3} ")" [0-9]?'
    g = compiler.compile(GrammarSpec("gbnf", src))
    jobs = [Job(i, (9, 10), n_predict=60, grammar=g,
                sampling=SamplingParams(seed=i, temperature=0.9 if i % 2 else 0.0))
            for i in range(6)]
    for fin in run(model, vocab, jobs):
        assert re.fullmatch(r"\([a-z]{1,8}(,[a-z]{1,8}){0,3}\)[0-9]?", fin.content), fin.content


def test_a_grammar_row_shares_the_batch_with_free_rows(model, vocab, compiler):
    g = compiler.compile(GrammarSpec("gbnf", 'root ::= "yes" | "no"'))
    free = Job(1, (5, 6), n_predict=12, ignore_eos=True,
               sampling=SamplingParams(seed=3, temperature=1.0))
    alone = run(model, vocab, [free])[0]
    both = run(model, vocab, [free, Job(2, (5, 6), n_predict=12, grammar=g,
                                        sampling=SamplingParams(seed=4))])
    assert both[0].tokens == alone.tokens
    assert both[1].content in ("yes", "no")

"""The stages after structuring: the custom handlers (each returns a new
record), the job built from a record, and generation_settings' projection."""

from __future__ import annotations

import math

import attrs
import pytest

from mlxcel_trio.server.adapters import AdapterTable
from mlxcel_trio.config import SamplingDefaults, ServerConfig
from mlxcel_trio.protocol.records import SamplingParams
from mlxcel_trio.grammar.compile import GrammarSpec
from mlxcel_trio.server.http.errors import ApiError
from mlxcel_trio.server.request import grammar_fields, jobs, sampler_fields
from mlxcel_trio.server.request.served import Served
from mlxcel_trio.protocol.fields import FIELDS_BY_NAME
from mlxcel_trio.server.request.schema import NativeRequest
from mlxcel_trio.server.request.settings import (
    GENERATION_SETTINGS,
    REDUCED_DROPS,
    generation_settings,
    reduced_settings,
)


class _Vocab:
    n_vocab = 100
    eos_ids = {2, 7}
    generation_defaults: dict = {}

    def tokenize(self, text, add_special=False, parse_special=False):
        return [ord(c) % 100 for c in text]


class _Info:
    path = "/models/x"


class _Bridge:
    vocab = _Vocab()
    info = _Info()

    def __init__(self) -> None:
        self.n = 0

    def next_job_id(self) -> int:
        self.n += 1
        return self.n


def _served(**sampling) -> Served:
    config = ServerConfig(model="x", sampling=SamplingDefaults(**sampling))
    return Served(_Bridge(), "m", jobs.server_defaults(config, _Vocab()), "b", n_slots=4,
                  state=_State())


class _State:
    adapters = AdapterTable()


def test_resolve_returns_a_new_record_and_leaves_its_input() -> None:
    served = _served()
    body = {"dry_base": 0.5, "logit_bias": [[5, 1.0]], "ignore_eos": True,
            "samplers": "edskypmxta"}
    rec = served.converter.structure(body, NativeRequest)
    before = attrs.asdict(rec)
    out = sampler_fields.resolve(body, rec, served)
    assert attrs.asdict(rec) == before and out is not rec
    assert out.dry_base == served.defaults.dry_base == 1.75
    assert out.logit_bias == ((5, 1.0), (2, -math.inf), (7, -math.inf))
    assert out.samplers[-1] == "adaptive_p"


@pytest.mark.parametrize("raw", [[], "x", ["a", 1], 5])
def test_dry_sequence_breakers_must_be_a_non_empty_string_array(raw) -> None:
    served = _served()
    body = {"dry_sequence_breakers": raw}
    rec = served.converter.structure(body, NativeRequest)
    with pytest.raises(ApiError, match="^Field 'dry_sequence_breakers': Error: "
                                       "dry_sequence_breakers must be a non-empty array of "
                                       "strings$"):
        sampler_fields.resolve(body, rec, served)


def test_samplers_of_another_type_keep_the_servers_chain() -> None:
    served = _served(samplers="penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;"
                              "temperature;adaptive_p")
    body = {"samplers": 5}
    rec = served.converter.structure(body, NativeRequest)
    assert sampler_fields.resolve(body, rec, served).samplers == served.defaults.samplers


def test_an_order_not_served_is_refused_naming_the_field() -> None:
    served = _served()
    body = {"samplers": ["top_k", "temperature"]}
    rec = served.converter.structure(body, NativeRequest)
    with pytest.raises(ApiError, match="^Field 'samplers': "):
        sampler_fields.resolve(body, rec, served)


def test_params_reads_every_sampling_param_off_the_record() -> None:
    rec = attrs.evolve(_served().defaults, top_k=3, min_keep=2, n_probs=4,
                       post_sampling_probs=True)
    p = sampler_fields.params(rec, seed=9)
    assert isinstance(p, SamplingParams)
    for a in attrs.fields(SamplingParams):
        assert getattr(p, a.name) == (9 if a.name == "seed" else getattr(rec, a.name))


def test_grammar_resolve_returns_the_grammar_in_force() -> None:
    served = _served(grammar='root ::= "x"')
    rec = served.converter.structure({}, NativeRequest)
    out = grammar_fields.resolve({}, rec, served)
    assert out.grammar_spec.text == 'root ::= "x"' and rec.grammar_triggers is None
    assert out.grammar_triggers == () and out.preserved_tokens == ()
    body = {"json_schema": {"type": "object"}}
    out = grammar_fields.resolve(body, served.converter.structure(body, NativeRequest), served)
    assert out.grammar_spec.kind == "json_schema" and out.grammar_field == "json_schema"
    body = {"grammar": {"type": "object"}}  # not a string: the server's grammar stays
    out = grammar_fields.resolve(body, served.converter.structure(body, NativeRequest), served)
    assert out.grammar_spec.kind == "gbnf" and out.grammar_field is None


def test_a_lazy_grammar_without_triggers_is_refused() -> None:
    served = _served()
    body = {"grammar": 'root ::= "x"', "grammar_lazy": True, "grammar_triggers": []}
    rec = served.converter.structure(body, NativeRequest)
    with pytest.raises(ApiError, match="^Field 'grammar_triggers': Error: no triggers set "
                                       "for lazy grammar!$"):
        grammar_fields.resolve(body, rec, served)


def test_jobs_read_id_slot_and_seed_from_the_record() -> None:
    served = _served()
    rec = jobs.resolve({"id_slot": 2, "seed": 10, "n": 3}, served)
    made = jobs.make_jobs(served, rec, [[1, 2]], {})
    assert [j.id_slot for j in made] == [2, -1, -1]
    assert [j.sampling.seed for j in made] == [10, 11, 12]
    assert all(j.settings is rec and j.shared_prompt for j in made)
    assert jobs.resolve({"id_slot": "1"}, served).id_slot == -1


def test_a_requests_n_predict_beats_the_servers() -> None:
    # upstream: the per-request limit takes priority; its -1 falls back to -n
    served = attrs.evolve(_served(n_predict=5), n_predict_cap=5)
    assert jobs.resolve({"n_predict": 9}, served).n_predict == 9
    assert jobs.resolve({"n_predict": 3}, served).n_predict == 3
    assert jobs.resolve({"n_predict": -1}, served).n_predict == 5
    assert jobs.resolve({}, served).n_predict == 5


# -- generation_settings -----------------------------------------------------------------

def test_every_reported_key_is_a_row_or_derived() -> None:
    derived = {"max_tokens", "reasoning_in_content", "grammar", "speculative.types"}
    assert all(k in FIELDS_BY_NAME or k in derived for k in GENERATION_SETTINGS)
    assert len(set(GENERATION_SETTINGS)) == len(GENERATION_SETTINGS)


def test_the_projection_keeps_to_jsons_order_and_types() -> None:
    served = _served()
    rec = jobs.resolve({"stop": ["a"], "logit_bias": [[5, False]], "temperature": 1e39,
                        "grammar": 'root ::= "x"', "grammar_lazy": True,
                        "grammar_triggers": [{"type": 2, "value": "a"}]}, served)
    gs = generation_settings(rec)
    assert list(gs) == list(GENERATION_SETTINGS)
    assert gs["temperature"] is None  # nlohmann writes inf as null
    assert gs["stop"] == ["a"] and gs["logit_bias"] == [{"bias": None, "token": 5}]
    assert gs["samplers"] == list(served.defaults.samplers)
    assert gs["grammar"] == 'root ::= "x"'
    assert gs["grammar_triggers"] == [{"type": 2, "value": "a"}]
    assert gs["max_tokens"] == gs["n_predict"] == -1
    assert (gs["chat_format"], gs["reasoning_format"], gs["lora"]) == ("Content-only", "none", [])
    reduced = reduced_settings(rec)
    assert list(reduced) == [k for k in GENERATION_SETTINGS if k not in REDUCED_DROPS]


def test_a_schema_or_tool_grammar_reports_no_gbnf() -> None:
    rec = attrs.evolve(_served().defaults, grammar_spec=GrammarSpec("lark", "start: x"))
    assert generation_settings(rec)["grammar"] == ""

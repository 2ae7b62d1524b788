"""The request record generated from NATIVE_FIELDS and the cattrs converter
that structures a body into it (server/request/schema.py).

Every row is exercised: its kind's coercion, its spellings in order, its
limits and upstream's error wording.  The expected values come from an
oracle written here (ctypes for the C++ conversions), not from the module.
"""

from __future__ import annotations

import ctypes
import math

import attrs
import pytest

from mlxcel_trio.protocol.records import SamplingParams
from mlxcel_trio.server.http.errors import ApiError, json_type_name
from mlxcel_trio.protocol.fields import FIELDS_BY_NAME, NATIVE_FIELDS, Field
from mlxcel_trio.server.request.schema import (
    DERIVED,
    TABLE_DEFAULTS,
    NativeRequest,
    make_record,
    parse_fields,
    request_converter,
)

ROWS = [f for f in NATIVE_FIELDS if f.kind != "nested"]
NUMBERS = ("int32", "int64", "uint32", "float")
WANT = {"bool": "boolean", "int32": "number", "int64": "number", "uint32": "number",
        "float": "number", "str": "string"}
SAMPLES = (0, 1, -1, 7, 2.7, -2.5, True, False, 0.1, 1e10, 2**31, 2**32 + 5, -(2**31) - 1,
           2**63, -(2**63) - 1, 5e38, "x", "", [], ["a"], {}, {"k": 1})


def _id(f: Field) -> str:
    return f.name if f.parent is None else f"{f.parent}.{f.name}"


def _body(field: Field, spelling: str, value) -> dict:
    return {field.parent: {spelling: value}} if field.parent else {spelling: value}


def _c_number(kind: str, value):
    """What a C++ member of the kind holds after nlohmann's get<T>()."""
    if isinstance(value, bool):
        value = int(value)
    if kind == "float":
        return ctypes.c_float(value).value
    if isinstance(value, float):
        value = int(value)  # truncation toward zero
    c_type = {"int32": ctypes.c_int32, "int64": ctypes.c_int64, "uint32": ctypes.c_uint32}[kind]
    return c_type(value & (2**64 - 1)).value


def _to_string(v: float, kind: str) -> str:
    return f"{v:f}" if kind == "float" else str(int(v))


def _expect(field: Field, value):
    """(value in the record, None) or (None, the message after the prefix)."""
    kind = field.kind
    if kind in ("json", "nested"):
        return value, None
    if kind == "slot":
        ok = isinstance(value, int) and not isinstance(value, bool)
        return (value if ok else field.default), None
    if kind == "stop":
        if isinstance(value, str):
            return (value,) if value else field.default, None
        if isinstance(value, list):
            bad = next((i for i in value if not isinstance(i, str)), None)
            if bad is not None:
                return None, ("[json.exception.type_error.302] type must be string, "
                              f"but is {json_type_name(bad)}")
            return tuple(i for i in value if i) or field.default, None
        return field.default, None
    type_error = (None, f"[json.exception.type_error.302] type must be {WANT[kind]}, "
                        f"but is {json_type_name(value)}")
    if kind == "bool":
        return (value, None) if isinstance(value, bool) else type_error
    if kind == "str":
        return (value, None) if isinstance(value, str) else type_error
    if not isinstance(value, (int, float)):
        return type_error
    number = _c_number(kind, value)
    if field.limits is None:
        return number, None
    lo, hi = field.limits
    if kind == "float":
        lo, hi = ctypes.c_float(lo).value, ctypes.c_float(hi).value
    if lo <= number <= hi:
        return number, None
    if field.hard:
        return None, (f"Value must be between {_to_string(lo, kind)} <= value <= "
                      f"{_to_string(hi, kind)}, but got {_to_string(number, kind)}")
    return min(max(number, lo), hi), None


# -- the record ------------------------------------------------------------------------

def test_one_attribute_per_row_in_table_order_then_the_derived_values() -> None:
    names = [a.name for a in attrs.fields(NativeRequest)]
    assert names == [f.attr for f in NATIVE_FIELDS] + list(DERIVED)
    assert "speculative_n_max" in names and "include_usage" in names and "id_slot" in names


@pytest.mark.parametrize("field", NATIVE_FIELDS, ids=_id)
def test_each_attribute_defaults_to_its_row(field: Field) -> None:
    assert getattr(TABLE_DEFAULTS, field.attr) == field.default


def test_the_record_is_frozen() -> None:
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        TABLE_DEFAULTS.top_k = 3  # type: ignore[misc]
    assert attrs.evolve(TABLE_DEFAULTS, top_k=3).top_k == 3 and TABLE_DEFAULTS.top_k == 40


def test_a_derived_value_may_not_shadow_a_row() -> None:
    with pytest.raises(ValueError, match="top_k"):
        make_record("Bad", NATIVE_FIELDS, {"top_k": attrs.field(default=None)})


def test_every_sampling_param_is_a_row() -> None:
    """sampler_fields.params reads SamplingParams' attributes off the record by name."""
    for a in attrs.fields(SamplingParams):
        assert a.name in FIELDS_BY_NAME, a.name


def test_id_slot_is_a_row_outside_upstreams_schema() -> None:
    row = FIELDS_BY_NAME["id_slot"]
    assert not row.schema and row.default == -1
    assert [f.name for f in NATIVE_FIELDS if not f.schema] == ["id_slot"]


# -- the converter: every row ------------------------------------------------------------

@pytest.mark.parametrize("value", SAMPLES, ids=repr)
@pytest.mark.parametrize("field", ROWS, ids=_id)
def test_each_rows_coercion_limits_and_wording(field: Field, value) -> None:
    want, error = _expect(field, value)
    for spelling in (field.name, *field.aliases):
        body = _body(field, spelling, value)
        if error is not None:
            with pytest.raises(ApiError) as exc:
                parse_fields(body)
            assert exc.value.args[0] == f"Field '{spelling}': {error}"
            assert exc.value.status == 400
            continue
        got = getattr(parse_fields(body), field.attr)
        assert got == want and type(got) is type(want), (spelling, got, want)


@pytest.mark.parametrize("field", ROWS, ids=_id)
def test_null_counts_as_absent(field: Field) -> None:
    base = attrs.evolve(TABLE_DEFAULTS, **{field.attr: "server"})
    for spelling in (field.name, *field.aliases):
        assert getattr(parse_fields(_body(field, spelling, None), base), field.attr) == "server"


def _distinct(field: Field, i: int):
    return {"bool": i % 2 == 0, "str": f"s{i}", "json": f"j{i}", "stop": (f"s{i}",)}.get(
        field.kind, i + 1)


@pytest.mark.parametrize("field", [f for f in ROWS if f.aliases], ids=_id)
def test_spellings_are_tried_in_order(field: Field) -> None:
    spellings = (field.name, *field.aliases)
    conv = request_converter(None, {"n_cmpl": (1, 10)})
    for first in range(len(spellings)):
        body = {s: _distinct(field, i) for i, s in enumerate(spellings)}
        body.update({s: None for s in spellings[:first]})
        got = getattr(conv.structure(body, NativeRequest), field.attr)
        assert got == _distinct(field, first)


@pytest.mark.parametrize("field", [f for f in ROWS if f.limits is not None], ids=_id)
def test_limits_at_their_bounds(field: Field) -> None:
    lo, hi = field.limits
    for edge in (lo, hi):
        if math.isfinite(edge):
            assert getattr(parse_fields({field.name: edge}), field.attr) == pytest.approx(edge)


def test_a_server_limit_replaces_the_rows() -> None:
    """n_cmpl's upper bound is the slot count, named by the spelling given."""
    conv = request_converter(None, {"n_cmpl": (1, 3)})
    assert conv.structure({"n": 3}, NativeRequest).n_cmpl == 3
    with pytest.raises(ApiError, match=r"^Field 'n': Value must be between 1 <= value <= 3, "
                                       r"but got 4$"):
        conv.structure({"n": 4}, NativeRequest)


def test_the_first_failing_row_in_table_order_is_reported() -> None:
    body = {"samplers": 1, "stop": [1], "top_k": "x", "stream": 1}
    with pytest.raises(ApiError, match=r"^Field 'stream': .* boolean, but is number$"):
        parse_fields(body)


def test_absent_fields_keep_the_servers_values() -> None:
    base = attrs.evolve(TABLE_DEFAULTS, top_k=7, stop=("end",), seed=3)
    assert parse_fields({}, base) == base
    got = parse_fields({"top_k": 2}, base)
    assert (got.top_k, got.stop, got.seed) == (2, ("end",), 3)


@pytest.mark.parametrize("stop", [[], "", ["", ""], 5, {}])
def test_no_usable_stop_string_keeps_the_servers(stop) -> None:
    base = attrs.evolve(TABLE_DEFAULTS, stop=("end",))
    assert parse_fields({"stop": stop}, base).stop == ("end",)


def test_a_nested_field_reads_inside_its_parent_only() -> None:
    assert parse_fields({"stream_options": {"include_usage": True}}).include_usage is True
    assert parse_fields({"include_usage": True}).include_usage is False
    assert parse_fields({"stream_options": 5}).include_usage is False
    with pytest.raises(ApiError, match=r"^Field 'include_usage': "):
        parse_fields({"stream_options": {"include_usage": 1}})


def test_unknown_keys_are_ignored() -> None:
    assert parse_fields({"nope": 1, "prompt": "x"}) == TABLE_DEFAULTS

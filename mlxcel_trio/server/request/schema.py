"""The request record, and the converter that structures a body into it.

`NativeRequest` is generated from `NATIVE_FIELDS` (fields.py): one frozen
attribute per row (named `Field.attr`, its default the row's), then the
values resolving derives (`DERIVED`).  Every reader uses attribute access;
a stage that changes a value returns a new record (`attrs.evolve`).  Every
generating route structures into this one record (the chat, Anthropic and
Responses surfaces first build the native body it reads, request/chat.py);
`make_record` builds another kind from another table.

`request_converter(base, limits)` returns a cattrs `Converter` whose hook
for `NativeRequest` applies upstream's evaluation rules, row by row in
table order (so the first failing row is the one reported, as upstream):

* JSON null counts as absent; the spellings are tried name first, then each
  alias in order, and the first present one is used and named in errors;
* the value is structured by its kind's hook (`KINDS`): a number converted
  the way a C++ member of that type receives it (truncated toward zero,
  wrapped to the member's width, float32-rounded), nlohmann's type errors;
* limits: hard ones refuse ("Value must be between ..."), soft ones clamp;
  `limits` overrides a row's where the server sets them (n_cmpl's upper
  bound is the slot count);
* an absent field keeps `base`'s value: the server's defaults record
  (command line, checkpoint), itself the table's defaults where the server
  sets nothing.  A present but empty stop list keeps the server's too.

Any failure raises ApiError("Field '<spelling>': <message>"), a 400.
"""

from __future__ import annotations

import math
from typing import Any, NewType

import attrs
import cattrs
import numpy as np

from ...grammar.compile import GrammarSpec
from ..http.errors import ApiError, type_mismatch
from ...protocol.fields import NATIVE_FIELDS, Field

# -- kinds: one structure hook each ------------------------------------------------

Bool = NewType("Bool", bool)
Int32 = NewType("Int32", int)
Int64 = NewType("Int64", int)
UInt32 = NewType("UInt32", int)
Float32 = NewType("Float32", float)
Str = NewType("Str", str)
Json = NewType("Json", object)
StopList = NewType("StopList", tuple)
SlotId = NewType("SlotId", int)


class _Absent(Exception):
    """A kind's hook saying "read this value as absent" (upstream's
    json_value falls back to the default on a type mismatch)."""


def _type_error(want: str, value: Any) -> ValueError:
    return ValueError(type_mismatch(want, value))


def _wrap(value: int, bits: int, signed: bool) -> int:
    mod = 1 << bits
    value %= mod
    if signed and value >= mod // 2:
        value -= mod
    return value


def _to_number(value: Any) -> float | int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value
    raise _type_error("number", value)


def _integer(bits: int, signed: bool):
    def structure(value: Any, _type: Any) -> int:
        num = _to_number(value)
        if isinstance(num, float):
            if not math.isfinite(num):
                raise _type_error("number", value)
            num = int(num)  # C++ truncation toward zero
        return _wrap(num, bits, signed)
    return structure


def _bool(value: Any, _type: Any) -> bool:
    if not isinstance(value, bool):
        raise _type_error("boolean", value)
    return value


def _float32(value: Any, _type: Any) -> float:
    with np.errstate(over="ignore"):  # beyond FLT_MAX is +-inf, as the C++ cast
        return float(np.float32(_to_number(value)))


def _str(value: Any, _type: Any) -> str:
    if not isinstance(value, str):
        raise _type_error("string", value)
    return value


def _stop_list(value: Any, _type: Any) -> tuple[str, ...]:
    """A string or an array of strings; empty strings are dropped, any
    other type is an empty list."""
    if isinstance(value, str):
        items = [value]
    elif isinstance(value, list):
        items = []
        for item in value:
            if not isinstance(item, str):
                raise _type_error("string", item)
            items.append(item)
    else:
        return ()
    return tuple(s for s in items if s)


def _slot_id(value: Any, _type: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Absent
    return value


@attrs.frozen
class Kind:
    structure_as: Any        # the NewType the converter dispatches on
    python: Any              # the record attribute's annotation


KINDS: dict[str, Kind] = {
    "bool": Kind(Bool, bool),
    "int32": Kind(Int32, int),
    "int64": Kind(Int64, int),
    "uint32": Kind(UInt32, int),
    "float": Kind(Float32, float),
    "str": Kind(Str, str | None),
    "json": Kind(Json, Any),        # the row's custom handler reads it
    "nested": Kind(Json, Any),      # structured through its subfields
    "stop": Kind(StopList, tuple[str, ...]),
    "slot": Kind(SlotId, int),      # an integer, else absent
}


def _kinds_converter() -> cattrs.Converter:
    conv = cattrs.Converter()
    for kind, hook in ((Bool, _bool), (Int32, _integer(32, True)), (Int64, _integer(64, True)),
                       (UInt32, _integer(32, False)), (Float32, _float32), (Str, _str),
                       (Json, lambda v, _t: v), (StopList, _stop_list), (SlotId, _slot_id)):
        conv.register_structure_hook(kind, hook)
    return conv


_KINDS = _kinds_converter()


# -- the record ----------------------------------------------------------------------

# Values resolving adds beyond the rows (grammar_fields.resolve / prepare).
DERIVED: dict[str, Any] = {
    # the grammar in force: the request's, else the server's (None: none)
    "grammar_spec": attrs.field(default=None, type=GrammarSpec | None),
    # the spelling a request's JSON schema came in (its compile errors name it)
    "grammar_field": attrs.field(default=None, type=str | None),
    # grammar_spec compiled (off the Trio thread, by grammar_fields.prepare)
    "grammar_compiled": attrs.field(default=None, eq=False, repr=False, type=object),
}


def make_record(name: str, fields: tuple[Field, ...], derived: dict[str, Any]) -> type:
    """A frozen attrs class: one keyword attribute per row, then `derived`."""
    body = {f.attr: attrs.field(default=f.default, type=KINDS[f.kind].python) for f in fields}
    clash = body.keys() & derived.keys()
    if clash:
        raise ValueError(f"derived values shadow fields: {sorted(clash)}")
    return attrs.make_class(name, {**body, **derived}, frozen=True, slots=True, kw_only=True)


NativeRequest = make_record("NativeRequest", NATIVE_FIELDS, DERIVED)
NativeRequest.__module__ = __name__
NativeRequest.__doc__ = "One completion request, resolved: every NATIVE_FIELDS row's value."

TABLE_DEFAULTS = NativeRequest()


# -- the converter -------------------------------------------------------------------

def _fmt(v: float | int, field: Field) -> str:
    """std::to_string: integers plainly, floats with six decimals."""
    return f"{v:f}" if field.kind == "float" else str(int(v))


def _check_limits(field: Field, value, limits: tuple[float, float] | None = None):
    limits = limits or field.limits
    if limits is None:
        return value
    lo, hi = limits
    if field.kind == "float":  # upstream compares float members with float limits
        lo, hi = float(np.float32(lo)), float(np.float32(hi))
    if lo <= value <= hi:
        return value
    if field.hard:
        raise ValueError(f"Value must be between {_fmt(lo, field)} <= value <= "
                         f"{_fmt(hi, field)}, but got {_fmt(value, field)}")
    return min(max(value, lo), hi)


def _lookup(body: dict, field: Field) -> tuple[str | None, Any]:
    for spelling in (field.name, *field.aliases):
        value = body.get(spelling)
        if value is not None:
            return spelling, value
    return None, None


def request_converter(base: Any = None,
                      limits: dict[str, tuple[float, float]] | None = None) -> cattrs.Converter:
    """A converter structuring a JSON object into a `NativeRequest` whose
    absent fields are `base`'s (default: the table's)."""
    base = TABLE_DEFAULTS if base is None else base
    limits = dict(limits or {})
    conv = _KINDS.copy()

    def structure(body: dict, _cls: type) -> Any:
        present: dict[str, Any] = {}
        nested = body.get("stream_options")
        for field in NATIVE_FIELDS:
            scope = body
            if field.parent is not None:
                scope = nested if isinstance(nested, dict) else {}
            spelling, raw = _lookup(scope, field)
            if spelling is None or field.kind == "nested":
                continue
            try:
                value = conv.structure(raw, KINDS[field.kind].structure_as)
                present[field.attr] = _check_limits(field, value, limits.get(field.name))
            except _Absent:
                continue
            except ValueError as exc:
                raise ApiError(f"Field '{spelling}': {exc}") from None
        if present.get("stop") == ():  # no usable stop string: the server's apply
            del present["stop"]
        return attrs.evolve(base, **present)

    conv.register_structure_hook(NativeRequest, structure)
    return conv


def parse_fields(body: dict, base: Any = None,
                 limits: dict[str, tuple[float, float]] | None = None) -> Any:
    """One body through a fresh converter (a server keeps its own: Served)."""
    return request_converter(base, limits).structure(body, NativeRequest)

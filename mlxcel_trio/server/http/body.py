"""Request bodies parsed at nlohmann's strictness, within hostile-input limits.

Python's json accepts more than nlohmann::json does: NaN and Infinity, numbers
past a double (as inf), lone surrogate escapes (as unencodable str), an empty
body.  Each of those would reach the handlers and come back as an invalid
response (`Infinity` in the JSON, a stream cut short by an encode error);
upstream answers all of them with a parse error (a 500 there; the 400 it
meant here, see errors.BAD_BODY), and so do we.

Limits (none upstream, which hands any body to a recursive-descent parser):
the body size is capped by the app before a byte is parsed (413), and arrays
and objects may nest at most MAX_DEPTH levels (400): Python's parser and every
later walk over the value recurse, so depth is what would turn a small body
into a RecursionError.  The depth is measured before parsing, on the text
with its strings removed, in C-speed passes.
"""

from __future__ import annotations

import json
import math
import re
import sys
from itertools import accumulate
from typing import Any

import trio

from .errors import ApiError, empty_input, number_overflow, parse_error, parse_error_at, too_deep

MAX_DEPTH = 128
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def nesting_depth(doc: str) -> int:
    """How deep arrays and objects nest in a JSON text (malformed text gives
    some number; the parser reports the malformation)."""
    if doc.count("[") + doc.count("{") <= MAX_DEPTH:
        return 0  # cannot exceed the limit: skip the scan
    brackets = _STRING.sub("", doc).encode("utf-8", "surrogatepass").translate(None, _NOT_BRACKET)
    return max(accumulate(_STEP[b] for b in brackets), default=0)


class _Constant(Exception):
    """NaN / Infinity / -Infinity: Python's json extensions, not JSON."""


def _reject_constant(name: str):
    raise _Constant(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise number_overflow(text)
    return value


def _finite_int(text: str) -> int:
    # nlohmann stores an integer past 64 bits as a double: past a double's
    # range it is an overflow (int() refuses past 4300 digits: far past it)
    try:
        value = int(text)
    except ValueError:
        raise number_overflow(text) from None
    if abs(value) > sys.float_info.max:
        raise number_overflow(text)
    return value


_STRING_OR_CONSTANT = re.compile(r'"(?:[^"\\]|\\.)*"|(-?Infinity|NaN)')
_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)", re.S)


def _constant_error(doc: str) -> ApiError:
    m = next(m for m in _STRING_OR_CONSTANT.finditer(doc) if m.group(1))
    if m.group(1).startswith("-"):
        return parse_error_at(doc, m.start() + 1, "syntax error while parsing value - invalid "
                              "number; expected digit after '-'", "-I")
    return parse_error_at(doc, m.start(), "syntax error while parsing value - invalid literal",
                          m.group(1)[0])


def _lone_surrogate(doc: str) -> ApiError | None:
    """Python's json decodes a lone \\uD800-\\uDFFF escape to a surrogate
    that no UTF-8 encoder accepts; nlohmann rejects the body instead."""
    high = None  # the high-surrogate escape still waiting for its low half
    for m in _ESCAPE.finditer(doc):
        unit = int(m.group(1), 16) if m.group(1) else -1
        if high is not None:
            if m.start() == high.end() and 0xDC00 <= unit <= 0xDFFF:
                high = None
                continue
            break
        if 0xD800 <= unit <= 0xDBFF:
            high = m
        elif 0xDC00 <= unit <= 0xDFFF:
            return parse_error_at(doc, m.end() - 1, "syntax error while parsing value - invalid "
                                  "string: surrogate U+DC00..U+DFFF must follow U+D800..U+DBFF",
                                  m.group(0))
    if high is None:
        return None
    return parse_error_at(doc, high.end() - 1, "syntax error while parsing value - invalid string: "
                          "surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF",
                          high.group(0))


def parse_body(raw: bytes) -> Any:
    """Parse at nlohmann's strictness: no empty body, no NaN/Infinity, no
    number past a double, no lone surrogate (parse errors), no nesting past
    MAX_DEPTH.  Runs in a worker thread for a large body (see app.py)."""
    if not raw:
        raise empty_input()
    try:
        doc = raw.decode("utf-8-sig")
        if nesting_depth(doc) > MAX_DEPTH:
            raise too_deep(MAX_DEPTH)
        body = json.loads(doc, parse_constant=_reject_constant, parse_float=_finite_float,
                          parse_int=_finite_int)
    except json.JSONDecodeError as exc:
        raise parse_error(exc) from None
    except UnicodeDecodeError as exc:
        head = raw[:exc.start].decode("utf-8", "replace")
        raise parse_error_at(head, len(head), "syntax error while parsing value - ill-formed "
                             "UTF-8 byte", f"\\x{raw[exc.start]:02x}") from None
    except _Constant:
        raise _constant_error(doc) from None
    if "\\u" in doc:
        err = _lone_surrogate(doc)
        if err is not None:
            raise err
    return body


THREAD_PARSE_BYTES = 256 * 1024  # a larger body is parsed off the event loop


async def read_json_body(request) -> Any:
    """The request's JSON body; a large one is parsed on a worker thread so
    the event loop (and every stream it feeds) never stalls on it."""
    raw = await request.get_data()
    if len(raw) > THREAD_PARSE_BYTES:
        return await trio.to_thread.run_sync(parse_body, raw)
    return parse_body(raw)

"""A scanner for JSON that may still be arriving.

Tool calls stream token by token, so the parser must tell three cases apart
at every step: the text so far is a complete value, a prefix of one (wait
for more), or something no continuation can make valid (give up on it).
`scan_value` answers that for one value; `scan_call` reads a tool-call
object (`{"name": ..., "arguments": ...}`) and reports its name once that
string is complete and the raw text span of its arguments.
"""

from __future__ import annotations

import json

import attrs

_WS = " \t\n\r"
_LITERALS = ("true", "false", "null")
_NUMBER_CHARS = frozenset("0123456789+-.eE")


class Invalid(Exception):
    """No continuation of the text can make it valid JSON."""


class Incomplete(Exception):
    """The text ends inside the value."""


def skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def _string_end(s: str, i: int) -> int:
    """`s[i]` is '"'; the index after the closing quote."""
    j = i + 1
    while True:
        if j >= len(s):
            raise Incomplete
        c = s[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return j + 1
        if c < " ":
            raise Invalid
        j += 1


def scan_value(s: str, i: int) -> int:
    """The end index of the JSON value starting at `s[i]` (no leading blanks)."""
    if i >= len(s):
        raise Incomplete
    c = s[i]
    if c == '"':
        return _string_end(s, i)
    if c == "{":
        return _container_end(s, i, "}", keyed=True)
    if c == "[":
        return _container_end(s, i, "]", keyed=False)
    for lit in _LITERALS:
        if s.startswith(lit, i):
            return i + len(lit)
        if lit.startswith(s[i:i + len(lit)]) and i + len(lit) > len(s):
            raise Incomplete
    if c in _NUMBER_CHARS:
        j = i
        while j < len(s) and s[j] in _NUMBER_CHARS:
            j += 1
        if j >= len(s):
            raise Incomplete  # more digits may follow
        try:
            json.loads(s[i:j])
        except ValueError:
            raise Invalid from None
        return j
    raise Invalid


def _container_end(s: str, i: int, close: str, keyed: bool) -> int:
    j = skip_ws(s, i + 1)
    if j >= len(s):
        raise Incomplete
    if s[j] == close:
        return j + 1
    while True:
        if keyed:
            if j >= len(s):
                raise Incomplete
            if s[j] != '"':
                raise Invalid
            j = skip_ws(s, _string_end(s, j))
            if j >= len(s):
                raise Incomplete
            if s[j] != ":":
                raise Invalid
            j = skip_ws(s, j + 1)
        j = skip_ws(s, scan_value(s, j))
        if j >= len(s):
            raise Incomplete
        if s[j] == close:
            return j + 1
        if s[j] != ",":
            raise Invalid
        j = skip_ws(s, j + 1)


@attrs.frozen
class CallScan:
    """What is known so far about one tool-call object."""

    name: str | None            # set once the name string is complete
    args_start: int | None      # where the arguments value starts
    args_end: int | None        # where it ends (None: still arriving)
    end: int | None             # the index after the object's '}' (None: still arriving)


ARGUMENT_KEYS = ("arguments", "parameters")


def scan_call(s: str, i: int, name_key: str = "name") -> CallScan:
    """Read the object starting at `s[i]` ('{').  Raises Invalid when the
    text can never become a call object.  Once the name is known the call
    stands: text that breaks the object after that ends the call there
    (reported as still open), so a call once seen is never taken back."""
    known = [None, None, None]  # name, args_start, args_end seen so far
    try:
        return _scan_call(s, i, known, name_key)
    except Invalid:
        if known[0] is None:
            raise
        return CallScan(*known, None)


def _scan_call(s: str, i: int, known: list, name_key: str = "name") -> CallScan:
    if s[i] != "{":
        raise Invalid
    name = args_start = args_end = None
    j = skip_ws(s, i + 1)
    if j < len(s) and s[j] == "}":
        return CallScan(None, None, None, j + 1)
    while True:
        if j >= len(s):
            return CallScan(name, args_start, args_end, None)
        if s[j] != '"':
            raise Invalid
        try:
            key_end = _string_end(s, j)
        except Incomplete:
            return CallScan(name, args_start, args_end, None)
        key = json.loads(s[j:key_end])
        j = skip_ws(s, key_end)
        if j >= len(s):
            return CallScan(name, args_start, args_end, None)
        if s[j] != ":":
            raise Invalid
        j = skip_ws(s, j + 1)
        if j >= len(s):
            return CallScan(name, args_start, args_end, None)
        start = j
        is_args = key in ARGUMENT_KEYS and args_start is None
        if is_args:
            args_start = known[1] = start
        try:
            j = scan_value(s, j)
        except Incomplete:
            return CallScan(name, args_start, args_end, None)
        if is_args:
            args_end = known[2] = j
        elif key == name_key and name is None and s[start] == '"':
            name = known[0] = json.loads(s[start:j])
        j = skip_ws(s, j)
        if j >= len(s):
            return CallScan(name, args_start, args_end, None)
        if s[j] == "}":
            return CallScan(name, args_start, args_end, j + 1)
        if s[j] != ",":
            raise Invalid
        j = skip_ws(s, j + 1)

"""Value domains for the option table, and upstream's two boolean vocabularies.

Every value-taking option names one domain object.  A domain turns the raw
string (from argv or from the environment: both arrive as text) into the typed
value that lands in `ServerConfig`, or raises `BadValue` with the reason.  Its
`domain` text is what a startup diagnostic quotes as "expected ...", so an
operator who typed a bad value learns the allowed range in the same line.

The two boolean rules are upstream's and differ on purpose:

* `is_truthy` decides whether a value-less flag fires from its environment
  variable: only the exact strings on, enabled, true, 1 do; anything else
  (including "0", "yes", "TRUE") leaves the flag off without an error.
* `parse_bool` reads a `--x/--no-x` pair's variable: the same four spellings
  mean true, off / disabled / false / 0 mean false, anything else stops
  startup.

Both compare case-sensitively, as upstream does.
"""

from __future__ import annotations

import math
import re
from typing import Any, Protocol

import attrs

from mlxcel_trio.config import fold_seed

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)

_TRUTHY = frozenset({"on", "enabled", "true", "1"})
_FALSY = frozenset({"off", "disabled", "false", "0"})


class BadValue(ValueError):
    """A value outside its domain; the message is the human reason."""


def is_truthy(text: str) -> bool:
    """Upstream's rule for firing a value-less flag from the environment."""
    return text in _TRUTHY


def parse_bool(text: str) -> bool:
    """Upstream's rule for a `--x/--no-x` pair's environment value."""
    if text in _TRUTHY:
        return True
    if text in _FALSY:
        return False
    raise BadValue("not a boolean")


BOOL_DOMAIN = "one of true, 1, on, enabled, false, 0, off, disabled"


class Domain(Protocol):
    """What the parser needs from a value kind."""

    @property
    def domain(self) -> str: ...

    def parse(self, text: str) -> Any: ...


_INT_RE = re.compile(r"[+-]?[0-9]+")


def _parse_int(text: str) -> int:
    # A regex rather than int() alone: int() would also take "1_000".
    text = text.strip()
    if not _INT_RE.fullmatch(text):
        raise BadValue("not an integer")
    return int(text, 10)


@attrs.frozen
class Int:
    """An integer in [lo, hi], plus any listed sentinel values below lo."""

    lo: int = INT32_MIN
    hi: int = INT32_MAX
    sentinels: tuple[int, ...] = ()
    message: str = "out of range"   # upstream's words, where it has some

    @property
    def domain(self) -> str:
        span = f"an integer in [{self.lo}, {self.hi}]"
        if not self.sentinels:
            return span
        return " or ".join([*(str(s) for s in self.sentinels), span])

    def parse(self, text: str) -> int:
        value = _parse_int(text)
        if value in self.sentinels or self.lo <= value <= self.hi:
            return value
        raise BadValue(self.message)


@attrs.frozen
class Seed:
    """A seed folded into uint32 space (upstream reads it as unsigned long)."""

    domain: str = "an integer (-1 = random; other negatives wrap into uint32)"

    def parse(self, text: str) -> int:
        value = _parse_int(text)
        if not -(2**63) <= value < 2**64:
            raise BadValue(f"{value} does not fit in 64 bits")
        return fold_seed(value)


@attrs.frozen
class Float:
    """A finite decimal number, optionally bounded."""

    lo: float | None = None
    hi: float | None = None

    @property
    def domain(self) -> str:
        if self.lo is None and self.hi is None:
            return "a finite number"
        lo = "-inf" if self.lo is None else f"{self.lo:g}"
        hi = "inf" if self.hi is None else f"{self.hi:g}"
        return f"a number in [{lo}, {hi}]"

    def parse(self, text: str) -> float:
        try:
            if "_" in text:
                raise ValueError(text)
            value = float(text.strip())
        except ValueError:
            raise BadValue("not a number") from None
        if not math.isfinite(value):
            raise BadValue("not a finite number")
        if (self.lo is not None and value < self.lo) or (
            self.hi is not None and value > self.hi
        ):
            raise BadValue("out of range")
        return value


@attrs.frozen
class Text:
    """A string, passed through unchanged; empty only when `allow_empty`."""

    allow_empty: bool = False

    @property
    def domain(self) -> str:
        return "a string" if self.allow_empty else "a non-empty string"

    def parse(self, text: str) -> str:
        if not text and not self.allow_empty:
            raise BadValue("empty")
        return text


@attrs.frozen
class Choice:
    """One of a fixed set of words, compared case-sensitively (as upstream)."""

    choices: tuple[str, ...]

    @property
    def domain(self) -> str:
        return "one of " + ", ".join(self.choices)

    def parse(self, text: str) -> str:
        if text not in self.choices:
            raise BadValue("not a known value")
        return text


@attrs.frozen
class CsvChoice:
    """A comma-separated list drawn from a fixed set of words."""

    choices: tuple[str, ...]

    @property
    def domain(self) -> str:
        return "a comma-separated list of " + ", ".join(self.choices)

    def parse(self, text: str) -> tuple[str, ...]:
        items = tuple(item.strip() for item in text.split(","))
        if not items or any(item not in self.choices for item in items):
            raise BadValue("not a list of known values")
        return items


@attrs.frozen
class GpuLayers:
    """Upstream's layer-offload count: auto, all, or an integer (a negative
    one is upstream's internal spelling of auto/all)."""

    domain: str = "auto, all, or an integer"

    def parse(self, text: str) -> str | int:
        if text in ("auto", "all"):
            return text
        return _parse_int(text)


@attrs.frozen
class IntPair:
    """Two integers given as two arguments (START END); the parser joins
    them with one space before they arrive here."""

    domain: str = "two integers"

    def parse(self, text: str) -> tuple[int, int]:
        parts = text.split()
        if len(parts) != 2:
            raise BadValue("needs two integers")
        return _parse_int(parts[0]), _parse_int(parts[1])


@attrs.frozen
class LoraList:
    """--lora (scaled False): comma-separated adapter paths, scale 1.0 each;
    --lora-scaled (scaled True): comma-separated FNAME:SCALE pairs.  Parses
    to ((path, scale), ...) in the order given."""

    scaled: bool = False

    @property
    def domain(self) -> str:
        if self.scaled:
            return "comma-separated FNAME:SCALE pairs with a finite numeric SCALE"
        return "comma-separated adapter paths"

    def parse(self, text: str) -> tuple[tuple[str, float], ...]:
        items = [item for item in text.split(",") if item]
        if not items:
            raise BadValue("no adapter named")
        if not self.scaled:
            return tuple((item, 1.0) for item in items)
        out = []
        for item in items:
            parts = item.split(":")
            if len(parts) != 2 or not parts[0]:
                raise BadValue(f"lora-scaled format: FNAME:SCALE (got {item!r})")
            try:
                scale = float(parts[1])
            except ValueError:
                raise BadValue(f"scale {parts[1]!r} of {parts[0]!r} is not a number") from None
            if not math.isfinite(scale):
                raise BadValue(f"scale {parts[1]!r} of {parts[0]!r} is not finite")
            out.append((parts[0], scale))
        return tuple(out)


@attrs.frozen
class CsvList:
    """A comma-separated list; items are kept verbatim (no trimming, as
    upstream), empty ones are dropped, order is kept."""

    domain: str = "a comma-separated list of non-empty strings"

    def parse(self, text: str) -> tuple[str, ...]:
        items = tuple(item for item in text.split(",") if item)
        if not items:
            raise BadValue("no non-empty item")
        return items

"""Refusal hooks, and the two factories for options we do not act on.

A llama-server command line must reach a diagnostic, never "unknown
option", and must never be accepted while it asks for something we do not
do.  So an option we do not act on still parses, and its value is classified
before any model is resolved:

* ``not_applicable`` -- the concept does not exist on MLX (the GGML thread
  pool, layer offload, GGUF files, server-side tools, ...).  Values that ask for
  nothing, or for what MLX already does, are *inert* and accepted silently;
  anything else is refused with why and what to use instead.
* ``deferred`` -- a later issue implements it.  The upstream default (or a
  neutral value) is inert; any other value is refused as not implemented yet
  (the issue number stays in the table and the manifest, not in the words).

A refusal is one line: the parser prefixes ``<option> <value>: `` and the
entry point ``error: ``, giving
``error: --threads '8': <why>; <what to use instead>``.
"""

from __future__ import annotations

from typing import Any, Callable, Union

import attrs

from mlxcel_trio.cli.record import Option

Words = Union[str, Callable[[Any], str]]
Inert = Callable[[Any], bool]

OMIT = "omit the option"


def NEVER(value: Any) -> bool:
    """No given value is inert."""
    return False


def ALWAYS(value: Any) -> bool:
    """Every value in the domain is inert."""
    return True


def equals(*inert: Any) -> Inert:
    """Inert exactly for the listed values (bools compare as bools)."""
    def check(value: Any) -> bool:
        for v in inert:
            if isinstance(v, bool) or isinstance(value, bool):
                if value is v:
                    return True
            elif value == v:
                return True
        return False
    return check


def at_most(limit: float) -> Inert:
    """Inert for numbers <= limit (upstream's "0 or less = automatic")."""
    return lambda value: value <= limit


def below(limit: float) -> Inert:
    return lambda value: value < limit


def _text(text: Words, value: Any) -> str:
    return text(value) if callable(text) else text


@attrs.frozen
class Refuser:
    """An option's refuse hook: None for an inert value, else the reason."""

    inert: Inert
    why: Words
    instead: Words | None = None
    accepts: str | None = None
    """The accepted values in words ("0 or less", "--no-ui"), or None."""

    def __call__(self, value: Any) -> str | None:
        if self.inert(value):
            return None
        instead = OMIT if self.instead is None else _text(self.instead, value)
        if self.accepts and self.instead is None:
            instead += f" (accepted: {self.accepts})"
        return f"{_text(self.why, value)}; {instead}"


DEFERRED_WHY = "not implemented yet in mlxcel-trio"


def _describe(spellings: tuple[str, ...], negations: tuple[str, ...], kind: str,
              default: Any, default_text: str | None) -> str | None:
    """The inert value in words, for options whose default is the inert one."""
    if default is None:
        return None
    if kind == "bool":
        pool = spellings if default else negations
        longs = [s for s in pool if s.startswith("--")]
        return (longs or list(pool))[0]
    if kind == "value":
        return (default_text or str(default)).split(",")[0].strip()
    return None


def deferred(
    spellings: tuple[str, ...], dest: str, help: str, *, issue: int,
    inert: Inert | None = None, accepts: str | None = None,
    instead: Words | None = None, **kw: Any,
) -> Option:
    """An option a later issue implements: its default (or the given
    `inert` values) is accepted, any other value is refused as not implemented yet."""
    default = kw.get("default")
    kind = kw.get("kind", "value")
    if inert is None:
        # A flag is off by default, so giving it always asks for something.
        inert = NEVER if default is None or kind == "flag" else equals(default)
        if accepts is None and kind != "flag":
            accepts = _describe(spellings, kw.get("negations", ()), kind, default,
                                kw.get("default_text"))
    hook = Refuser(inert, DEFERRED_WHY, instead, accepts)
    return Option(spellings, dest, help, status="deferred", owner=issue, refuse=hook, **kw)


def not_applicable(
    spellings: tuple[str, ...], dest: str, help: str, *, why: Words,
    inert: Inert = NEVER, accepts: str | None = None, instead: Words | None = None,
    owner: int = 3, hidden: bool = True, **kw: Any,
) -> Option:
    """An option with no MLX meaning: inert values pass, the rest is refused.
    Hidden from --help by default: rendering it would promise a backend
    feature that does not exist."""
    hook = Refuser(inert, why, instead, accepts)
    return Option(spellings, dest, help, status="not_applicable", owner=owner,
                  refuse=hook, hidden=hidden, **kw)


def tuning(
    spellings: tuple[str, ...], dest: str, help: str, *, quiet: Inert = NEVER,
    owner: int = 3, hidden: bool = False, **kw: Any,
) -> Option:
    """A setting whose only effect upstream is on speed, memory or placement
    inside GGML (threads, CPU placement, memory locking and mapping, layer
    offload, device splits, flash attention).  Outputs do not depend on it, so
    refusing it would only stop copied command lines from starting: its value
    is checked against its domain, accepted, and named once at startup as
    having no effect on MLX unless `quiet` says it asks for nothing.  Listed
    in --help, as upstream lists it, marked as having no effect on MLX."""
    return Option(spellings, dest, help, status="not_applicable", owner=owner,
                  quiet=quiet, hidden=hidden, **kw)


# ---- reasons shared by several options -------------------------------------

NO_GGML = "mlxcel-trio runs every tensor operation through MLX and has no GGML backend"
ONE_DEVICE = "mlxcel-trio serves from one MLX device and never splits a model across devices"
NO_THREADPOOL = "MLX schedules its own work; there is no CPU thread pool to tune"
NO_PLACEMENT = "MLX has no CPU thread pool whose placement, priority or polling could be set"
NO_NGRAM_MOD = "mlxcel-trio does not run ngram-mod speculative decoding yet"
NO_PROJECTOR = ("mlxcel-trio serves text-only MLX checkpoints and has no separate "
                "multimodal projector")
NO_TOOLS = "mlxcel-trio runs nothing server-side on a model's behalf"
GGUF_ONLY = "mlxcel-trio serves MLX SafeTensors checkpoints, not GGUF files"

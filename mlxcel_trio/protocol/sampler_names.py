"""Sampler names and letters, as upstream spells them, and the orders served.

Upstream reads a sampler list from --samplers (names separated by ';'),
--sampler-seq (one letter per stage) or the request's `samplers` field (an
array of names, or a string of letters).  Names are matched
case-insensitively, with the kebab-case and no-underscore spellings of each
canonical name and three extra aliases; anything unknown is dropped with a
warning.  mlxcel-trio serves upstream's default order, optionally with
adaptive_p (whose position does not matter: upstream always runs it last,
in place of the final draw).  Light: imported by the command line too.
"""

from __future__ import annotations

from .records import DEFAULT_CHAIN

CANONICAL = ("dry", "top_k", "top_p", "top_n_sigma", "typ_p", "min_p", "temperature", "xtc",
             "infill", "penalties", "adaptive_p")
LETTERS = {"d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "s": "top_n_sigma",
           "m": "min_p", "t": "temperature", "x": "xtc", "i": "infill", "e": "penalties",
           "a": "adaptive_p"}


def _alias_table() -> dict[str, str]:
    table = {}
    for name in CANONICAL:
        if "_" in name:
            table[name.replace("_", "-")] = name
            table[name.replace("_", "")] = name
    table.update(nucleus="top_p", temp="temperature", typ="typ_p")
    table.update({n: n for n in CANONICAL})
    return table


ALIASES = _alias_table()
DEFAULT_NAMES = ";".join(DEFAULT_CHAIN)
DEFAULT_LETTERS = "".join(next(c for c, n in LETTERS.items() if n == s) for s in DEFAULT_CHAIN)


def from_names(names) -> tuple[str, ...]:
    return tuple(ALIASES[n.lower()] for n in names if n.lower() in ALIASES)


def from_letters(chars: str) -> tuple[str, ...]:
    return tuple(LETTERS[c] for c in chars if c in LETTERS)


def unsupported(chain: tuple[str, ...]) -> str | None:
    """Why a resolved chain cannot be served, or None."""
    if tuple(s for s in chain if s != "adaptive_p") == DEFAULT_CHAIN:
        return None
    shown = ";".join(chain) or "(empty)"
    return (f"sampler order {shown} is not served: mlxcel-trio runs upstream's default order "
            f"({DEFAULT_NAMES}), optionally with adaptive_p")

"""Lowering a parsed GBNF grammar to llguidance's Lark dialect.

llguidance lexes greedily: a terminal that can still grow is never cut
short, so `("a" | "ab") "bc"` written with multi-character terminals would
reject "abc", which GBNF (a character-level pushdown automaton) accepts.
So every GBNF element becomes a terminal of exactly one code point (a
literal string is a sequence of them) and all structure stays in rules:
no terminal can be extended, and the language is GBNF's exactly.

Code points are written as \\x{..} escapes inside regex terminals.  Rust's
regex (and so llguidance) has no surrogate code points: they are dropped
from sets; a set left empty matches nothing, as it never matches valid
UTF-8 text upstream either.  Tokens become `<[id]>` / `<[^id]>`.
"""

from __future__ import annotations

from .gbnf import Grammar

MAX_CP = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)
_NOTHING = "nothing__"  # a rule with no alternative that can match


def _split(lo: int, hi: int) -> list[tuple[int, int]]:
    lo, hi = max(lo, 0), min(hi, MAX_CP)
    out = []
    for a, b in ((lo, min(hi, _SURROGATES[0] - 1)), (max(lo, _SURROGATES[1] + 1), hi)):
        if a <= b:
            out.append((a, b))
    return out


def _cp(c: int) -> str:
    return f"\\x{{{c:x}}}"


def _set(ranges, negated: bool) -> str | None:
    parts = []
    for lo, hi in ranges:
        for a, b in _split(lo, hi):
            parts.append(_cp(a) if a == b else f"{_cp(a)}-{_cp(b)}")
    if not parts:
        # [^<surrogates only>] is any code point; [<surrogates only>] is nothing
        return "/(?s:.)/" if negated else None
    return f"/[{'^' if negated else ''}{''.join(parts)}]/"


def _elem(e) -> str:
    kind = e[0]
    if kind == "chars":
        return _set(e[1], e[2]) or _NOTHING
    if kind == "any":
        return "/(?s:.)/"
    if kind == "ref":
        return f"g{e[1]}"
    return f"<[^{e[1]}]>" if e[2] else f"<[{e[1]}]>"


def _seq(alt) -> str:
    return " ".join(_elem(e) for e in alt) if alt else '""'


def _tail_recursive(rid: int, alts) -> tuple[list, list] | None:
    """A -> a1 A | a2 A | b1 | b2 (A nowhere else) as ([a1, a2], [b1, b2])."""
    me = ("ref", rid)
    loops = [alt[:-1] for alt in alts if alt and alt[-1] == me and me not in alt[:-1]]
    exits = [alt for alt in alts if me not in alt]
    if loops and exits and len(loops) + len(exits) == len(alts):
        return loops, exits
    return None


def _optional_chains(rules) -> dict[int, tuple[tuple, int]]:
    """Rules of the form R_k -> S R_(k-1) | "" down to R_1 -> S | "" (what
    GBNF's S{m,n} produces): rule id -> (S, k), i.e. R_k is S{0,k}."""
    chains: dict[int, tuple[tuple, int]] = {}

    def chain(rid: int, depth: int = 0):
        if rid in chains:
            return chains[rid]
        alts = rules[rid]
        if depth > len(rules) or len(alts) != 2 or alts[1] != ():
            return None
        body = alts[0]
        if body and body[-1][0] == "ref" and body[-1][1] != rid:
            inner = chain(body[-1][1], depth + 1)
            if inner is not None and inner[0] == body[:-1]:
                chains[rid] = (inner[0], inner[1] + 1)
                return chains[rid]
        if body and ("ref", rid) not in body:
            chains[rid] = (body, 1)
            return chains[rid]
        return None

    for rid in range(len(rules)):
        chain(rid)
    return chains


def to_lark(g: Grammar) -> str:
    """The Lark text of grammar `g`; `start` is its root.

    A rule that only recurses at the end of some alternatives (what GBNF's
    `*` and `+` produce) is written as a repetition, (loops)* (exits): the
    same language, and llguidance's Earley rows stay flat where a right-
    recursive chain would grow one item per repetition.  Likewise the
    nested optional rules of S{m,n} become (S){0,n-m}."""
    lines = [f"start: g{g.root}"]
    chains = _optional_chains(g.rules)
    for rid, alts in enumerate(g.rules):
        tail = _tail_recursive(rid, alts)
        if rid in chains and chains[rid][1] > 1:
            item, k = chains[rid]
            body = f"({_seq(item)}){{0,{k}}}"
        elif tail is not None:
            loops, exits = tail
            body = (f"({' | '.join(_seq(a) for a in loops)})* "
                    f"({' | '.join(_seq(a) for a in exits)})")
        else:
            body = " | ".join(_seq(a) for a in alts)
        lines.append(f"g{rid}: {body}")
    needs_nothing = _NOTHING in "\n".join(lines)
    if needs_nothing:
        lines.append(f"{_NOTHING}: /[^\\x{{0}}-\\x{{10ffff}}]/")
    return "\n".join(lines) + "\n"

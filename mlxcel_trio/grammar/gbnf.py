"""GBNF, parsed with llama.cpp's grammar semantics.

Theory of operation.  The parser mirrors what llama.cpp's grammar parser
builds, because several user-visible rules depend on that structure rather
than on the syntax alone:

* A rule is a list of alternatives, an alternative a list of elements:
  a character set (one code point; a literal string is one element per
  character), any code point (`.`, newline included), a rule reference, or
  a token (`<[id]>`, `<name>`, and their `!` negations).
* Groups and repetitions create generated rules, named `<rule>_<n>` with
  n the next symbol number, exactly as upstream numbers them: the
  repetition budget counts symbols, so a group's weight is the number of
  symbols created while parsing it (rule names first seen inside it
  included).
* Repetition rewrites the preceding item: S{m,n} is m copies of S followed
  by n - m nested optional rules; S{m,} is m copies and one recursive rule.
  `x{0}` erases the item, a repetition applies to everything the previous
  one produced (`x{2}{3}` is six x), a maximum above 2000 becomes unbounded
  while a minimum above 2000 is an error, and the product of nested
  repetition counts must stay below 2000.
* Identifiers are [A-Za-z0-9-] (no underscore); `#` comments run to the end
  of the line and count as whitespace; a newline ends a rule unless it is
  inside parentheses or follows `::=` or `|`; an empty alternative is legal.
* After parsing: every referenced rule must be defined, `root` must exist,
  and left recursion is rejected across every rule, reachable or not, with
  upstream's notion of which rules may be empty.

Errors are `GbnfError` with upstream's wording.
"""

from __future__ import annotations

from typing import Callable

import attrs

MAX_REPETITION = 2000

# Elements are tuples: ("chars", ((lo, hi), ...), negated), ("any",),
# ("ref", rule_id), ("token", token_id, negated).


class GbnfError(ValueError):
    """A grammar llama.cpp would refuse; str() is the reason."""


def chars(ranges, negated=False) -> tuple:
    return ("chars", tuple(ranges), negated)


ANY = ("any",)


def ref(rule_id: int) -> tuple:
    return ("ref", rule_id)


def token(tid: int, negated=False) -> tuple:
    return ("token", tid, negated)


@attrs.frozen
class Grammar:
    names: tuple[str, ...]                       # symbol id -> name
    rules: tuple[tuple[tuple[tuple, ...], ...], ...]   # id -> alternatives -> elements
    root: int


def _is_word(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "-")


def _is_digit(c: str) -> bool:
    return "0" <= c <= "9"


class _Parser:
    def __init__(self, src: str, tokenize: Callable[[str], list[int]] | None) -> None:
        self.src = src + "\0"  # a sentinel, as the C string's terminator
        self.tokenize = tokenize
        self.symbols: dict[str, int] = {}
        self.rules: dict[int, list[list[tuple]]] = {}

    # -- lexical helpers -------------------------------------------------------------

    def at(self, pos: int) -> str:
        return self.src[pos]

    def rest(self, pos: int) -> str:
        return self.src[pos:-1]

    def space(self, pos: int, newline_ok: bool) -> int:
        s = self.src
        while s[pos] in " \t#" or (newline_ok and s[pos] in "\r\n"):
            if s[pos] == "#":
                while s[pos] not in "\r\n\0":
                    pos += 1
            else:
                pos += 1
        return pos

    def name_end(self, pos: int) -> int:
        end = pos
        while _is_word(self.src[end]):
            end += 1
        if end == pos:
            raise GbnfError(f"expecting name at {self.rest(pos)}")
        return end

    def int_end(self, pos: int) -> int:
        end = pos
        while _is_digit(self.src[end]):
            end += 1
        if end == pos:
            raise GbnfError(f"expecting integer at {self.rest(pos)}")
        return end

    def hex(self, pos: int, size: int) -> tuple[int, int]:
        value, end = 0, pos
        while end < pos + size and self.src[end] != "\0":
            c = self.src[end]
            if c in "0123456789abcdefABCDEF":
                value = value * 16 + int(c, 16)
                end += 1
            else:
                break
        if end != pos + size:
            raise GbnfError(f"expecting {size} hex chars at {self.rest(pos)}")
        return value, end

    def char(self, pos: int) -> tuple[int, int]:
        s = self.src
        if s[pos] == "\\":
            e = s[pos + 1]
            if e == "x":
                return self.hex(pos + 2, 2)
            if e == "u":
                return self.hex(pos + 2, 4)
            if e == "U":
                return self.hex(pos + 2, 8)
            simple = {"t": 9, "r": 13, "n": 10, "\\": 92, '"': 34, "[": 91, "]": 93}
            if e in simple:
                return simple[e], pos + 2
            raise GbnfError(f"unknown escape at {self.rest(pos)}")
        if s[pos] != "\0":
            return ord(s[pos]), pos + 1
        raise GbnfError("unexpected end of input")

    def token_elem(self, pos: int) -> tuple[int, int]:
        s = self.src
        if s[pos] != "<":
            raise GbnfError(f"expecting '<' at {self.rest(pos)}")
        start = pos
        pos += 1
        if s[pos] == "[":
            end = self.int_end(pos + 1)
            tid = int(s[pos + 1:end]) & 0xFFFF_FFFF
            if s[end] != "]":
                raise GbnfError(f"expecting ']' at {self.rest(end)}")
            if s[end + 1] != ">":
                raise GbnfError(f"expecting '>' at {self.rest(end + 1)}")
            return tid, end + 2
        if self.tokenize is None:
            raise GbnfError(f"no vocab to parse token at {self.rest(start)}")
        while s[pos] not in "\0>":
            pos += 1
        if s[pos] != ">":
            raise GbnfError(f"expecting '>' at {self.rest(pos)}")
        pos += 1
        text = s[start:pos]
        ids = self.tokenize(text)
        if len(ids) != 1:
            raise GbnfError(f"invalid token '{text}'")
        return ids[0], pos

    # -- symbols -------------------------------------------------------------------------

    def symbol(self, name: str) -> int:
        return self.symbols.setdefault(name, len(self.symbols))

    def generated(self, base: str) -> int:
        sid = len(self.symbols)
        self.symbols[f"{base}_{sid}"] = sid
        return sid

    # -- grammar ---------------------------------------------------------------------------

    def alternates(self, pos: int, name: str, rule_id: int, nested: bool) -> int:
        alts: list[list[tuple]] = []
        seq: list[tuple] = []
        pos = self.sequence(pos, name, seq, nested)
        alts.append(seq)
        while self.at(pos) == "|":
            pos = self.space(pos + 1, True)
            seq = []
            pos = self.sequence(pos, name, seq, nested)
            alts.append(seq)
        self.rules[rule_id] = alts
        return pos

    def sequence(self, pos: int, name: str, seq: list[tuple], nested: bool) -> int:
        s = self.src
        last = len(seq)      # where the item a repetition applies to starts
        weight = 1           # upstream's n_prev_rules

        def repeat(lo: int, hi: int | None) -> None:
            nonlocal weight
            if last == len(seq):
                raise GbnfError(f"expecting preceding item to */+/?/{{ at {self.rest(pos)}")
            item = seq[last:]
            total = hi if hi is not None and hi > 0 else (lo if lo > 0 else 1)
            if weight * total >= MAX_REPETITION:
                raise GbnfError(
                    "number of rules that are going to be repeated multiplied by the new "
                    "repetition exceeds sane defaults, please reduce the number of repetitions "
                    "or rule complexity")
            if lo == 0:
                del seq[last:]
            else:
                for _ in range(1, lo):
                    seq.extend(item)
            n_opt = 1 if hi is None else hi - lo
            prev = 0
            for i in range(n_opt):
                rid = self.generated(name)
                body = list(item)
                if i > 0 or hi is None:
                    body.append(ref(rid if hi is None else prev))
                self.rules[rid] = [body, []]
                prev = rid
            if n_opt > 0:
                seq.append(ref(prev))
            weight *= total

        while s[pos] != "\0":
            c = s[pos]
            if c == '"':
                pos += 1
                last, weight = len(seq), 1
                while s[pos] != '"':
                    if s[pos] == "\0":
                        raise GbnfError("unexpected end of input")
                    cp, pos = self.char(pos)
                    seq.append(chars([(cp, cp)]))
                pos = self.space(pos + 1, nested)
            elif c == "[":
                pos += 1
                negated = s[pos] == "^"
                if negated:
                    pos += 1
                last, weight = len(seq), 1
                ranges = []
                while s[pos] != "]":
                    if s[pos] == "\0":
                        raise GbnfError("unexpected end of input")
                    lo, pos = self.char(pos)
                    hi = lo
                    if s[pos] == "-" and s[pos + 1] != "]":
                        if s[pos + 1] == "\0":
                            raise GbnfError("unexpected end of input")
                        hi, pos = self.char(pos + 1)
                    ranges.append((lo, hi))
                if ranges:
                    seq.append(chars(ranges, negated))
                pos = self.space(pos + 1, nested)
            elif c in "<!":
                negated = c == "!"
                if negated:
                    pos += 1
                tid, end = self.token_elem(pos)
                last, weight = len(seq), 1
                seq.append(token(tid, negated))
                pos = self.space(end, nested)
            elif _is_word(c):
                end = self.name_end(pos)
                rid = self.symbol(s[pos:end])
                pos = self.space(end, nested)
                last, weight = len(seq), 1
                seq.append(ref(rid))
            elif c == "(":
                pos = self.space(pos + 1, True)
                before = len(self.symbols)
                sub = self.generated(name)
                pos = self.alternates(pos, name, sub, True)
                weight = max(1, len(self.symbols) - before)
                last = len(seq)
                seq.append(ref(sub))
                if s[pos] != ")":
                    raise GbnfError(f"expecting ')' at {self.rest(pos)}")
                pos = self.space(pos + 1, nested)
            elif c == ".":
                last, weight = len(seq), 1
                seq.append(ANY)
                pos = self.space(pos + 1, nested)
            elif c in "*+?":
                pos = self.space(pos + 1, nested)
                repeat(*{"*": (0, None), "+": (1, None), "?": (0, 1)}[c])
            elif c == "{":
                pos = self.space(pos + 1, nested)
                if not _is_digit(s[pos]):
                    raise GbnfError(f"expecting an int at {self.rest(pos)}")
                end = self.int_end(pos)
                lo = int(s[pos:end])
                pos = self.space(end, nested)
                hi: int | None = None
                if s[pos] == "}":
                    hi = lo
                    pos = self.space(pos + 1, nested)
                elif s[pos] == ",":
                    pos = self.space(pos + 1, nested)
                    if _is_digit(s[pos]):
                        end = self.int_end(pos)
                        hi = int(s[pos:end])
                        pos = self.space(end, nested)
                    if s[pos] != "}":
                        raise GbnfError(f"expecting '}}' at {self.rest(pos)}")
                    pos = self.space(pos + 1, nested)
                else:
                    raise GbnfError(f"expecting ',' at {self.rest(pos)}")
                if lo > MAX_REPETITION:
                    raise GbnfError("number of repetitions exceeds sane defaults, please "
                                    "reduce the number of repetitions")
                if hi is not None and hi > MAX_REPETITION:
                    hi = None  # an oversized maximum means "no maximum"
                repeat(lo, hi)
            else:
                break
        return pos

    def rule(self, start: int) -> int:
        end = self.name_end(start)
        pos = self.space(end, False)
        name = self.src[start:end]
        rid = self.symbol(name)
        if self.src[pos:pos + 3] != "::=":
            raise GbnfError(f"expecting ::= at {self.rest(pos)}")
        pos = self.space(pos + 3, True)
        pos = self.alternates(pos, name, rid, False)
        if self.src[pos] == "\r":
            pos += 2 if self.src[pos + 1] == "\n" else 1
        elif self.src[pos] == "\n":
            pos += 1
        elif self.src[pos] != "\0":
            raise GbnfError(f"expecting newline or end at {self.rest(pos)}")
        return self.space(pos, True)

    def parse(self) -> None:
        pos = self.space(0, True)
        while self.src[pos] != "\0":
            pos = self.rule(pos)
        size = max(self.rules) + 1 if self.rules else 0
        names = {i: n for n, i in self.symbols.items()}
        for rid in range(size):
            alts = self.rules.get(rid)
            if alts is None:
                raise GbnfError("Undefined rule")
            for alt in alts:
                for e in alt:
                    if e[0] == "ref" and (e[1] >= size or e[1] not in self.rules):
                        raise GbnfError(f"Undefined rule identifier '{names[e[1]]}'")


def _left_recursive(rules: list[list[list[tuple]]]) -> int | None:
    """Upstream's check: the first rule index from which left recursion is
    found, visiting every rule."""
    n = len(rules)
    visited, in_progress, may_be_empty = [False] * n, [False] * n, [False] * n

    def visit(i: int) -> bool:
        if in_progress[i]:
            return True
        in_progress[i] = True
        if any(len(alt) == 0 for alt in rules[i]):
            may_be_empty[i] = True
        for alt in rules[i]:
            for e in alt:
                if e[0] == "ref":
                    if visit(e[1]):
                        return True
                    if not may_be_empty[e[1]]:
                        break
                else:
                    break
        in_progress[i] = False
        visited[i] = True
        return False

    for i in range(n):
        if not visited[i] and visit(i):
            return i
    return None


def parse(src: str, tokenize: Callable[[str], list[int]] | None = None,
          root: str = "root") -> Grammar:
    """Parse GBNF source; `tokenize(text)` resolves `<name>` tokens (with
    special tokens parsed) and may be None when there is no vocabulary."""
    p = _Parser(src, tokenize)
    p.parse()
    if not p.rules:
        raise GbnfError("failed to parse grammar")
    if root not in p.symbols:
        raise GbnfError(f"grammar does not contain a '{root}' symbol")
    size = max(p.rules) + 1
    rules = [p.rules[i] for i in range(size)]
    bad = _left_recursive(rules)
    if bad is not None:
        raise GbnfError(f"unsupported grammar, left recursion detected for nonterminal at "
                        f"index {bad}")
    names = [""] * len(p.symbols)
    for n, i in p.symbols.items():
        names[i] = n
    return Grammar(
        names=tuple(names),
        rules=tuple(tuple(tuple(alt) for alt in r) for r in rules),
        root=p.symbols[root],
    )

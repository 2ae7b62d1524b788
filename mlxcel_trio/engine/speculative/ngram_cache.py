"""ngram-cache: upstream's lookup decoding (common/ngram-cache), three
token-count tables consulted in turn.

- The context table, one per row, counts which token followed every 1- to
  4-gram of the row's own history.
- The dynamic table (-lcd) and the static table (-lcs) are read once from
  files in upstream's binary layout and shared, read only, by every row.

A draft grows one token at a time.  For the n-grams ending at the draft's
tip, longest first, the context table proposes its most frequent
follower (weighted by the static table's count for the last two tokens)
when enough samples agree (the "lax" floors); failing that the dynamic
table does so under the "strict" floors; failing that the static table's
own most frequent follower of the last two tokens.  The draft stops at
the first step with no proposal, or at eight tokens.

As upstream does, the context table is fed only the tokens that are new
since the last draft (n-grams crossing that boundary are not counted),
and neither file is written back.
Engine thread only.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...protocol.lookup_cache import NGRAM_MAX, Table, load_table  # noqa: F401 (re-exported)
from .drafters import Ask, PerRow

NGRAM_MIN, NGRAM_STATIC = 1, 2
N_DRAFT = 8                     # upstream's fixed draft length for this type
# per n-gram length 1..4: fewest samples, and the percentage the winner needs
LAX = ((2, 66), (2, 50), (1, 50), (1, 50))
STRICT = ((4, 75), (3, 66), (2, 66), (2, 66))


def update(table: Table, tokens: Sequence[int]) -> None:
    """Count, for every 1- to 4-gram inside `tokens`, the token after it."""
    size = len(tokens)
    for n in range(NGRAM_MIN, NGRAM_MAX + 1):
        for i in range(n, size):
            part = table.setdefault(tuple(tokens[i - n:i]), {})
            token = tokens[i]
            part[token] = part.get(token, 0) + 1


def _from_static(static: Table, key: tuple[int, ...]) -> int | None:
    part = static.get(key)
    if not part:
        return None
    best, best_n, total = None, 0, 0
    for token, count in part.items():
        if count > best_n:
            best, best_n = token, count
        total += count
    min_n, min_pct = LAX[NGRAM_STATIC - 1]
    if total < min_n or 100 * best_n < min_pct * total:
        return None
    return best


def _from_primary(primary: Table, keys: list[tuple[int, ...]], static_part: dict[int, int],
                  floors: tuple[tuple[int, int], ...]) -> int | None:
    for i in range(len(keys) - 1, -1, -1):   # longest n-gram first
        part = primary.get(keys[i])
        if not part:
            continue
        best, best_n, best_s, total = None, 0, 0, 0
        for token, count in part.items():
            s = 100 * static_part[token] if token in static_part else 1
            if count * s > best_n * best_s:
                best, best_n, best_s = token, count, s
            total += count
        min_n, min_pct = floors[i]
        if total < min_n or 100 * best_n < min_pct * total:
            continue
        return best
    return None


def draft(seq: list[int], context: Table, dynamic: Table, static: Table,
          n_draft: int = N_DRAFT) -> list[int]:
    """Up to n_draft tokens continuing `seq` (history plus the sampled token)."""
    if len(seq) < NGRAM_STATIC:
        return []
    tail = list(seq[-NGRAM_MAX:])
    out: list[int] = []
    while len(out) < n_draft:
        static_key = tuple(tail[-NGRAM_STATIC:])
        static_part = static.get(static_key, {})
        keys = [tuple(tail[-n:]) for n in range(NGRAM_MIN, NGRAM_MAX + 1) if n <= len(tail)]
        token = _from_primary(context, keys, static_part, LAX)
        if token is None:
            token = _from_primary(dynamic, keys, static_part, STRICT)
        if token is None:
            token = _from_static(static, static_key)
        if token is None:
            break
        out.append(token)
        tail = (tail + [token])[-NGRAM_MAX:]
    return out


class NgramCache(PerRow):
    """The drafter: a context table per row, the two file tables shared."""

    def __init__(self, static: Table | None = None, dynamic: Table | None = None) -> None:
        self.static = static or {}
        self.dynamic = dynamic or {}
        self._rows: dict[int, tuple[list[int], Table]] = {}   # uid -> ([fed], context)

    def _context(self, uid: int, history: list[int], last: int) -> Table:
        row = self._rows.get(uid)
        if row is None:
            row = self._rows[uid] = ([0], {})
        fed, context = row
        if fed[0] < len(history) + 1:
            update(context, [*history[fed[0]:], last])
            fed[0] = len(history) + 1
        return context

    def may_propose(self, uid: int, history: list[int]) -> bool:
        # the tables answer for any tip; only a too-short history has none
        return len(history) + 1 >= NGRAM_STATIC

    def propose(self, asks: Sequence[Ask]) -> list[list[int]]:
        out = []
        for a in asks:
            context = self._context(a.uid, a.history, a.last)
            out.append(draft([*a.history[-NGRAM_MAX:], a.last], context, self.dynamic,
                             self.static))
        return out

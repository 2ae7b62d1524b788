"""One sequence's grammar state: the matcher, and the lazy-grammar triggers.

The engine calls `mask_for(history)` once per step with the sequence's whole
context (prompt and generated tokens as ints).  Tokens it has not seen yet
advance the state; the result is the allowed-token mask for the next draw,
or None while a lazy grammar waits for its trigger.

Lazy grammars follow upstream's rules: while waiting, a trigger token
starts the grammar with that token, and otherwise each token's text is
appended to a buffer that every trigger pattern searches (a pattern that
starts with ^ and ends with $ is first tried against the whole buffer);
on a match the grammar starts from the first non-empty capture group (else
the match start): the buffered tokens from there are fed to the matcher,
except that a token the match starts inside is replaced by its remaining
bytes, re-tokenized, because llguidance advances by whole tokens where
llama.cpp replays partial token pieces.  Patterns use Python's `re`.

A matcher that reaches an error state (a replayed text the grammar
rejects) allows only end-of-generation tokens, so the sequence ends.
"""

from __future__ import annotations

import re
from typing import Callable

import attrs
import numpy as np


@attrs.frozen
class Triggers:
    patterns: tuple[str, ...] = ()    # regexes (word triggers already escaped)
    tokens: tuple[int, ...] = ()

    def compiled(self) -> tuple[re.Pattern, ...]:
        return tuple(re.compile(p, re.S) for p in self.patterns)


def find_trigger(pattern: re.Pattern, text: str) -> int | None:
    """Where the constrained text starts, or None (upstream's find)."""
    src = pattern.pattern
    m = None
    if src.startswith("^") and src.endswith("$"):
        m = pattern.fullmatch(text)
    if m is None:
        m = pattern.search(text)
    if m is None:
        return None
    for i in range(1, (m.re.groups or 0) + 1):
        if m.group(i):
            return m.start(i)
    return m.start()


class Constraint:
    def __init__(self, matcher, n_vocab: int, n_prompt: int, lazy: bool, triggers: Triggers,
                 piece: Callable[[int], bytes], tokenize: Callable[[str], list[int]],
                 eos_ids=()) -> None:
        self._m = matcher
        self._eos_ids = tuple(eos_ids)
        self._n_vocab = n_vocab
        self._seen = n_prompt
        self.awaiting = lazy
        self._trigger_tokens = frozenset(triggers.tokens)
        self._patterns = triggers.compiled() if lazy else ()
        self._piece = piece
        self._tokenize = tokenize
        self._buffer = b""
        self._spans: list[tuple[int, int, int]] = []   # (token, start, end) in _buffer
        self._words = (n_vocab + 31) // 32
        self._bits = np.zeros((1, self._words), dtype=np.int32)
        self._eos_only: np.ndarray | None = None

    @property
    def failed(self) -> bool:
        return self._m.is_error()

    def _accept(self, tok: int) -> None:
        if not self.awaiting:
            self._m.consume_token(tok)
            return
        if tok in self._trigger_tokens:
            self.awaiting = False
            self._buffer, self._spans = b"", []
            self._m.consume_token(tok)
            return
        begin = len(self._buffer)
        self._buffer += self._piece(tok)
        self._spans.append((tok, begin, len(self._buffer)))
        text = self._buffer.decode("utf-8", "replace")
        for pat in self._patterns:
            start = find_trigger(pat, text)
            if start is not None:
                self._replay(len(text[:start].encode("utf-8")))
                return

    def _replay(self, start: int) -> None:
        """Feed the grammar what the trigger match covers: whole tokens as
        they are, and the tail bytes of a token the match starts inside,
        re-tokenized (llguidance advances by whole tokens)."""
        self.awaiting = False
        for tok, lo, hi in self._spans:
            if hi <= start:
                continue
            if lo >= start:
                self._m.consume_token(tok)
            else:
                tail = self._buffer[start:hi].decode("utf-8", "replace")
                self._m.consume_tokens(self._tokenize(tail))
        self._buffer, self._spans = b"", []

    def force_end(self) -> None:
        """Nothing to close: only a reasoning budget (chat/budget.py) acts on
        realtime control; a grammar it wraps is never asked."""

    def mask_for(self, history: list[int]) -> np.ndarray | None:
        for tok in history[self._seen:]:
            self._accept(tok)
        self._seen = len(history)
        if self.awaiting:
            return None
        if self._m.is_error():
            return self._eos_mask()
        self._m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")
        return bits[: self._n_vocab].astype(bool)[None, :]

    def _eos_mask(self) -> np.ndarray:
        if self._eos_only is None:
            mask = np.zeros((1, self._n_vocab), dtype=bool)
            for t in self._eos_ids:
                if 0 <= t < self._n_vocab:
                    mask[0, t] = True
            self._eos_only = mask
        return self._eos_only

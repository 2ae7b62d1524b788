"""Stop strings matched on decoded text across token boundaries.

Semantics (``apply_stops`` is the one-shot reference): the match with the
earliest start in the whole text wins; among matches starting at the same
position the stop listed first wins.  The text before the match is the content
and the match plus everything after it is dropped.  Empty stops are ignored.

``StopMatcher`` streams the same result: for any split of a text into pieces,
the concatenated ``emit`` values (plus ``flush()`` when no stop fired) equal
``apply_stops(text, stops)[0]``, and the stop word reported equals its second
element.  To get there it holds back unsent text that may still turn into
(part of) a stop:

* the longest suffix of the unsent text that is a proper prefix of some stop;
* when a stop has completed but a better match (starting earlier, or at the
  same place but listed earlier) could still complete, the decision waits.
  This only happens when one stop sits inside another, is bounded by the
  longest stop's length, and ``flush()`` settles it at end of generation.

Held text is always shorter than the longest stop, so each ``feed`` searches
only ``held + piece``; with no stops ``feed`` is a pass-through.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["StopResult", "StopMatcher", "apply_stops", "partial_stop_len"]


@dataclass(frozen=True, slots=True)
class StopResult:
    emit: str  # text now safe to send to the client
    stopped: bool  # a stop string was found: generation must end
    word: str = ""  # the stop string that matched ("" when not stopped)


def _clean(stops: Sequence[str]) -> tuple[str, ...]:
    return tuple(s for s in stops if s)


def _first_match(text: str, stops: Sequence[str]) -> tuple[int, int]:
    """(start, stop index) of the earliest complete match, or (-1, -1)."""
    best, best_i = -1, -1
    for i, stop in enumerate(stops):
        pos = text.find(stop, 0, len(text) if best < 0 else best + len(stop) - 1)
        if pos >= 0 and (best < 0 or pos < best):
            best, best_i = pos, i
    return best, best_i


def _pending_starts(text: str, stops: Sequence[str]) -> list[int]:
    """Per stop, the earliest start t such that text[t:] is a proper prefix
    of that stop (i.e. the stop may still complete there), or -1."""
    n = len(text)
    out = []
    for stop in stops:
        found = -1
        head = stop[0]
        t = text.find(head, max(0, n - len(stop) + 1))
        while t >= 0:
            if stop.startswith(text[t:]):
                found = t
                break
            t = text.find(head, t + 1)
        out.append(found)
    return out


def partial_stop_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop."""
    starts = [t for t in _pending_starts(text, _clean(stops)) if t >= 0]
    return len(text) - min(starts) if starts else 0


def apply_stops(text: str, stops: Sequence[str]) -> tuple[str, str]:
    """One-shot reference: ``(content, word)``; word is "" when no stop matched."""
    clean = _clean(stops)
    pos, i = _first_match(text, clean)
    if pos < 0:
        return text, ""
    return text[:pos], clean[i]


class StopMatcher:
    """Incremental stop-string matcher for one generated sequence."""

    __slots__ = ("_stops", "_held", "_stopped", "_word")

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = _clean(stops)
        self._held = ""
        self._stopped = False
        self._word = ""

    @property
    def stops(self) -> tuple[str, ...]:
        return self._stops

    @property
    def held(self) -> str:
        """Unsent text currently held back."""
        return self._held

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def word(self) -> str:
        return self._word

    def feed(self, text: str) -> StopResult:
        """Add a decoded piece; say what may be sent and whether to stop."""
        if self._stopped:
            return StopResult("", True, self._word)
        stops = self._stops
        if not stops:
            return StopResult(text, False)
        window = self._held + text if self._held else text
        if not window:
            return StopResult("", False)
        pos, idx = _first_match(window, stops)
        pending = _pending_starts(window, stops)
        if pos >= 0:
            # Could a better match still complete?  Only one that starts
            # earlier, or at pos with a stop listed before the one found.
            waiting = [t for j, t in enumerate(pending)
                       if t >= 0 and (t < pos or (t == pos and j < idx))]
            if not waiting:
                self._held = ""
                self._stopped, self._word = True, stops[idx]
                return StopResult(window[:pos], True, stops[idx])
            cut = min(waiting)
        else:
            starts = [t for t in pending if t >= 0]
            cut = min(starts) if starts else len(window)
        self._held = window[cut:]
        return StopResult(window[:cut], False)

    def flush(self) -> str:
        """End of generation: return the held text, settling a waiting match."""
        if self._stopped:
            return ""
        held, self._held = self._held, ""
        pos, idx = _first_match(held, self._stops)
        if pos >= 0:
            self._stopped, self._word = True, self._stops[idx]
            return held[:pos]
        return held

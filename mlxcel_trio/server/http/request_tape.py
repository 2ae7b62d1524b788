"""What a request drew by chance (its ids, its clock), recorded so that a
continuation of its stream in another process draws the same.

A resumable stream (X-Conversation-Id) whose server dies is continued by
rebuilding its request (server/sessions/takeover.py); the rebuilt request
must name the same `chatcmpl-...` id and `created` time as the frames
already published.  Every such draw goes through `taped(fn)`: outside a
taped request it is `fn()`; inside, the value is kept (and, in a
continuation, the earlier process's value is played back instead).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Callable, Iterable


class Tape:
    def __init__(self, played: Iterable[Any] = ()) -> None:
        self._played = list(played)
        self.kept: list[Any] = []

    def value(self, fn: Callable[[], Any]) -> Any:
        v = self._played.pop(0) if self._played else fn()
        self.kept.append(v)
        return v


_current: ContextVar[Tape | None] = ContextVar("mlxcel_request_tape", default=None)


def start(played: Iterable[Any] = ()) -> Tape:
    """Tape the rest of this request's draws (the view calls it)."""
    tape = Tape(played)
    _current.set(tape)
    return tape


def current() -> Tape | None:
    return _current.get()


def taped(fn: Callable[[], Any]) -> Any:
    tape = _current.get()
    return fn() if tape is None else tape.value(fn)

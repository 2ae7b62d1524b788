"""What one HTTP request holds until it ends: `RequestResources`.

Rules:
- The ASGI wrapper in server/app.py makes one per request, puts it in the
  ASGI scope under SCOPE_KEY, and closes it once the request is over,
  however it ended (answered, failed, or cancelled by a disconnect).
  Handlers reach it through `request_resources()`, the one accessor.
- What a handler opens that must not outlive the request (a job handle,
  a registry entry) is registered with `own` / `on_close`; closing runs
  each registered close once, newest first, synchronously: it runs while
  the request is being cancelled, so it must never await.  A handle's
  `close()` is idempotent, so one also closed on the normal path by its
  `finally` costs nothing.
- `detach` takes a handle off the request when work that outlives the
  request takes it over (sessions/detached.py): from then on that work
  closes it, and the request's end does not.

Why this exists beside the handlers' own `finally`: a request can be
cancelled in a gap no `finally` covers (a streamed response built but never
iterated), and its jobs must still be cancelled when it ends.
"""

from __future__ import annotations

from typing import Callable, Protocol, TypeVar

from quart import request

SCOPE_KEY = "mlxcel.request_resources"


class Closeable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closeable)


class RequestResources:
    def __init__(self) -> None:
        self._closers: list[Callable[[], None]] = []  # in registration order
        self.closed = False

    def on_close(self, fn: Callable[[], None]) -> None:
        """Run `fn` when the request ends (at once if it already has)."""
        if self.closed:
            fn()
        else:
            self._closers.append(fn)

    def own(self, resource: C) -> C:
        """Close `resource` when the request ends; returns it."""
        self.on_close(resource.close)
        return resource

    def detach(self, resource: Closeable) -> None:
        """Take `resource` off the request: its new owner closes it."""
        try:
            self._closers.remove(resource.close)  # bound methods compare by object
        except ValueError:
            pass

    def close(self) -> None:
        """Idempotent.  Every closer runs even if an earlier one raised; the
        first error is re-raised after the rest ran."""
        if self.closed:
            return
        self.closed = True
        closers, self._closers = self._closers, []
        error: Exception | None = None
        for fn in reversed(closers):
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - re-raised below
                error = error or exc
        if error is not None:
            raise error

    def __len__(self) -> int:
        return len(self._closers)


def request_resources() -> RequestResources:
    """The current request's resources (set by server/app.py's wrapper)."""
    return request.scope[SCOPE_KEY]

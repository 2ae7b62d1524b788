"""The hypercorn internals that listen.py builds on, checked before the server starts.

listen.serve is hypercorn's trio worker loop around a subclass of its
TCPServer that replaces three methods (`_read_data`, `protocol_send`, and
`_idle_timeout` with nothing: the keep-alive is the read's deadline, kept
from hypercorn's `Updated(idle)` events), reads the h11 state machine at
`server.protocol.protocol.connection`, and counts on the h11 protocol not
recycling a connection once the worker context is `terminated`.  None of that
is hypercorn's public API.  If an upgrade renamed `_read_data`, the override
would never run (hypercorn's own reader would be back, and no request body
would be bounded by a read timeout); if it moved the connection, the server could
no longer tell a request still arriving from a response streaming.  So
every name listen.py takes from hypercorn, every method it overrides or
calls, the instance attributes it uses and the attribute path itself are
listed here and looked at once, before the model loads: a mismatch refuses
to start with one line naming the installed version and the supported range
(pyproject.toml pins the same range; a unit test keeps the two equal).

The runner calls `check()` before it imports listen.py, so a name that is
gone is reported here rather than as an ImportError traceback.
"""

from __future__ import annotations

import importlib
import inspect
from importlib import metadata
from typing import Any

SUPPORTED = ">=0.18,<0.19"

# "module:qualified.name" -> attributes it must have (methods, class fields)
HAS: dict[str, tuple[str, ...]] = {
    "hypercorn.config:Config": ("create_ssl_context", "graceful_timeout",
                                "wsgi_max_body_size"),
    "hypercorn.events:Closed": (),
    "hypercorn.events:RawData": (),
    "hypercorn.events:Updated": (),
    "hypercorn.protocol.h11:H11Protocol": ("_maybe_recycle",),
    "hypercorn.protocol:ProtocolWrapper": ("handle",),
    "hypercorn.trio.lifespan:Lifespan": ("handle_lifespan", "wait_for_startup",
                                         "wait_for_shutdown"),
    "hypercorn.trio.tcp_server:MAX_RECV": (),
    "hypercorn.trio.tcp_server:TCPServer": ("run", "_read_data", "protocol_send",
                                            "_idle_timeout"),
    "hypercorn.trio.worker_context:WorkerContext": (),
    "hypercorn.typing:ConnectionState": (),
    "hypercorn.utils:ShutdownError": (),
    "hypercorn.utils:raise_shutdown": (),
    "hypercorn.utils:wrap_app": (),
}

# functions whose code must still name these attributes: `run` builds the
# ProtocolWrapper at `self.protocol`, hands it our `protocol_send`, calls
# our `_read_data` and starts the (now empty) `_idle_timeout`; the h11
# protocol reports a finished response with Updated and, once the context is
# terminated, closes instead of recycling; the constructors set the instance
# attributes listen.py uses
NAMED_IN: dict[str, tuple[str, ...]] = {
    "hypercorn.trio.tcp_server:TCPServer.run": ("ProtocolWrapper", "protocol",
                                                "protocol_send", "_read_data",
                                                "_idle_timeout"),
    "hypercorn.protocol.h11:H11Protocol._maybe_recycle": ("terminated", "Updated",
                                                          "Closed"),
    "hypercorn.trio.tcp_server:TCPServer.__init__": ("send_lock", "stream"),
    "hypercorn.trio.worker_context:WorkerContext.__init__": ("terminated",),
}

# the parameters listen.serve passes, in order (after self)
PARAMETERS: dict[str, tuple[str, ...]] = {
    "hypercorn.trio.tcp_server:TCPServer.__init__": ("app", "config", "context", "state",
                                                     "stream"),
    "hypercorn.trio.lifespan:Lifespan.__init__": ("app", "config", "state"),
    "hypercorn.trio.worker_context:WorkerContext.__init__": ("max_requests",),
    "hypercorn.utils:wrap_app": ("app", "wsgi_max_body_size", "mode"),
    "hypercorn.events:Updated": ("idle",),
}


class HypercornUnsupported(Exception):
    """The installed hypercorn lacks an internal listen.py needs; str() is the
    one-line reason."""


def installed_version() -> str:
    try:
        return metadata.version("hypercorn")
    except metadata.PackageNotFoundError:
        return "(not installed)"


def check() -> None:
    """Raise HypercornUnsupported unless every internal listen.py uses is there."""
    found = missing()
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise HypercornUnsupported(
            f"hypercorn {installed_version()} is not supported: {found[0]}{more}; "
            f"mlxcel-trio needs hypercorn{SUPPORTED}")


def missing() -> list[str]:
    """Each internal that is not where listen.py expects it, described."""
    problems: list[str] = []
    for target, attributes in HAS.items():
        problems += _has(target, attributes)
    for target, names in NAMED_IN.items():
        problems += _named_in(target, names)
    for target, names in PARAMETERS.items():
        problems += _parameters(target, names)
    return problems or _connection_path()


class _Missing(Exception):
    pass


def _resolve(target: str) -> Any:
    module_name, _, qualname = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError:
        raise _Missing(f"module {module_name} is missing") from None
    for part in qualname.split("."):
        if not hasattr(obj, part):
            raise _Missing(f"{module_name}.{qualname} is missing")
        obj = getattr(obj, part)
    return obj


def _dotted(target: str) -> str:
    return target.replace(":", ".")


def _has(target: str, attributes: tuple[str, ...]) -> list[str]:
    try:
        obj = _resolve(target)
    except _Missing as exc:
        return [str(exc)]
    return [f"{_dotted(target)}.{a} is missing" for a in attributes if not hasattr(obj, a)]


def _named_in(target: str, names: tuple[str, ...]) -> list[str]:
    try:
        code = getattr(_resolve(target), "__code__", None)
    except _Missing as exc:
        return [str(exc)]
    used = set(code.co_names) if code is not None else set()
    return [f"{_dotted(target)} no longer uses {n}" for n in names if n not in used]


def _parameters(target: str, names: tuple[str, ...]) -> list[str]:
    try:
        params = list(inspect.signature(_resolve(target)).parameters)
    except _Missing as exc:
        return [str(exc)]
    except (TypeError, ValueError):
        return [f"{_dotted(target)} has no signature"]
    if params[:1] == ["self"]:
        params = params[1:]
    if tuple(params[:len(names)]) != names:
        return [f"{_dotted(target)} takes ({', '.join(params)}), not ({', '.join(names)})"]
    return []


def _connection_path() -> list[str]:
    """Build an HTTP/1.1 ProtocolWrapper as TCPServer.run does and follow
    `.protocol.connection` to the h11 state machine listen.py reads."""
    import h11
    from hypercorn.config import Config
    from hypercorn.protocol import ProtocolWrapper
    from hypercorn.trio.worker_context import WorkerContext
    from hypercorn.typing import ConnectionState

    path = "ProtocolWrapper(...).protocol.connection"
    try:
        wrapper = ProtocolWrapper(None, Config(), WorkerContext(None), None,
                                  ConnectionState({}), False, None, None, None, "http/1.1")
        connection = wrapper.protocol.connection
    except (AttributeError, TypeError, ValueError) as exc:  # a changed constructor or path
        return [f"{path} cannot be followed for HTTP/1.1 ({type(exc).__name__}: {exc})"]
    if not isinstance(connection, h11.Connection):
        return [f"{path} is a {type(connection).__name__}, not an h11.Connection"]
    return []

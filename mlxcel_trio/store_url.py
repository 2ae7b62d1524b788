"""--session-store: which session store a replica shares with its peers.

`memory` (the default) keeps stream sessions, stored responses and control
entries in this process (server/sessions/streams.py, response_store.py,
control.py).  A `redis://` / `rediss://` URL (Valkey speaks the same
protocol; `valkey://` / `valkeys://` are accepted as spellings of the same)
shares them with every replica pointed at the same server
(server/sessions/shared.py).  The URL may carry a password
(`redis://:secret@host:6379/0`); it is never printed: `redacted` is what
logs and errors show.

This module imports no client library (the standard library only): the
command line checks a URL before anything heavy loads, and reads it here
rather than in the server.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

MEMORY = "memory"
SCHEMES = {"redis": "redis", "rediss": "rediss", "valkey": "redis", "valkeys": "rediss"}


def problem(url: str) -> str | None:
    """Why `url` cannot name a session store (None: it can)."""
    if url == MEMORY:
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"not a URL ({exc}); use memory or redis://HOST:PORT/DB"
    if parts.scheme not in SCHEMES:
        return ("expected memory, or a redis://, rediss://, valkey:// or valkeys:// URL "
                "(e.g. redis://127.0.0.1:6379/0)")
    if not parts.hostname:
        return "the URL names no host; use redis://HOST:PORT/DB"
    if port == 0:
        return "port 0 is not a server's port"
    db = parts.path.strip("/")
    if db and not db.isdigit():
        return f"the database must be a number (got {db!r}); use redis://HOST:PORT/DB"
    return None


def client_url(url: str) -> str:
    """`url` in the spelling redis-py reads (valkey:// -> redis://)."""
    parts = urlsplit(url)
    return urlunsplit((SCHEMES[parts.scheme], *parts[1:]))


def redacted(url: str) -> str:
    """`url` without its user name and password: what may be logged."""
    if url == MEMORY:
        return url
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<unparsable URL>"
    if ":" in host:
        host = f"[{host}]"
    return urlunsplit((parts.scheme, host + port, parts.path, "", ""))


def password(url: str) -> str | None:
    """The password a URL carries, for the log redaction list."""
    try:
        return urlsplit(url).password or None
    except ValueError:
        return None

"""--session-store: which session store a replica shares with its peers.

`memory` (the default) keeps stream sessions, stored responses and control
entries in this process (server/sessions/streams.py, response_store.py,
control.py).  A `redis://` / `rediss://` URL (Valkey speaks the same
protocol; `valkey://` / `valkeys://` are accepted as spellings of the same)
shares them with every replica pointed at the same server
(server/sessions/shared.py).  `file://DIR` keeps one server's stream
sessions in DIR on local disk, so a restarted server continues them
(server/sessions/file_store.py).  The URL may carry a password
(`redis://:secret@host:6379/0`); it is never printed: `redacted` is what
logs and errors show.

This module imports no client library (the standard library only): the
command line checks a URL before anything heavy loads, and reads it here
rather than in the server.
"""

from __future__ import annotations

import fcntl
import os
from urllib.parse import unquote, urlsplit, urlunsplit

MEMORY = "memory"
FILE = "file"
SCHEMES = {"redis": "redis", "rediss": "rediss", "valkey": "redis", "valkeys": "rediss"}


def problem(url: str) -> str | None:
    """Why `url` cannot name a session store (None: it can)."""
    if url == MEMORY:
        return None
    if url.startswith(FILE + ":"):
        return file_problem(url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"not a URL ({exc}); use memory or redis://HOST:PORT/DB"
    if parts.scheme not in SCHEMES:
        return ("expected memory, file://DIR, or a redis://, rediss://, valkey:// or "
                "valkeys:// URL (e.g. redis://127.0.0.1:6379/0)")
    if not parts.hostname:
        return "the URL names no host; use redis://HOST:PORT/DB"
    if port == 0:
        return "port 0 is not a server's port"
    db = parts.path.strip("/")
    if db and not db.isdigit():
        return f"the database must be a number (got {db!r}); use redis://HOST:PORT/DB"
    return None


def is_file(url: str) -> bool:
    return url.startswith(FILE + "://")


def file_dir(url: str) -> str:
    """The directory a file:// URL names (file:///abs/dir or file://rel/dir)."""
    parts = urlsplit(url)
    return unquote(parts.netloc + parts.path) or "."


def file_problem(url: str) -> str | None:
    """Why a file:// URL cannot hold this server's sessions (None: it can):
    checked at startup, before the model loads."""
    if not is_file(url):
        return "expected file://DIR (e.g. file:///var/lib/mlxcel/sessions)"
    path = file_dir(url)
    alternative = "; use a writable directory, or memory"
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{path!r} is not a directory{alternative}"
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".probe-{os.getpid()}")
        with open(probe, "wb") as f:
            f.write(b"x")
        os.unlink(probe)
    except OSError as exc:
        return f"cannot write in {path!r} ({exc.strerror or exc}){alternative}"
    try:
        fd = os.open(os.path.join(path, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        return f"cannot create its lock file ({exc.strerror or exc}){alternative}"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError:
        return (f"another server is using {path!r} (one server per directory); use another "
                "directory, or a redis:// store shared between replicas")
    finally:
        os.close(fd)
    return None


def client_url(url: str) -> str:
    """`url` in the spelling redis-py reads (valkey:// -> redis://)."""
    parts = urlsplit(url)
    return urlunsplit((SCHEMES[parts.scheme], *parts[1:]))


def redacted(url: str) -> str:
    """`url` without its user name and password: what may be logged."""
    if url == MEMORY or is_file(url):
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

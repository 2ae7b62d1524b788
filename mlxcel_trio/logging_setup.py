"""Logging: where the log goes, what reaches it, how a line looks, and the
redaction every written byte passes through.

Rules (see docs/compatibility.md, logging-and-presets shard):

1. One destination, by precedence: --log-disable (no handler at all), then
   --log-file on the command line, then LLAMA_ARG_LOG_FILE, then
   LLAMA_LOG_FILE, then standard output.  The choice is made in cli/ before
   the model reference resolves; this module only opens and installs it.
2. A log file is opened by `open_log_file` and nothing else: never through a
   symbolic link (the last component is refused by lstat and by O_NOFOLLOW,
   so a swap between the two cannot win), never a directory, only under an
   existing parent; created 0600, and an existing file is tightened to 0600.
   Lines are appended.
3. Every configured secret is registered before the first line is written,
   and every sink (the log, standard output, standard error) is wrapped in a
   `RedactingStream`.  Redaction works on whole lines: a formatter or print()
   writes one line in several calls, so a secret split across two writes
   would slip past a per-write scan.  A line is released at "\\n" or "\\r".
4. Verbosity is upstream's threshold (0 output only, 1 error, 2 warning,
   3 info, 4 trace, 5 debug); -v means everything.  `level_for` maps it onto
   Python levels, with TRACE (15) between INFO and DEBUG.
5. A line looks like upstream's: ``M.SS.mmm.uuu L name: message``, the
   timestamp being the time since the log was installed, ``L`` one of
   I/W/E/D (trace lines are I, as upstream's TRC are).  The timestamp is part
   of the prefix: --no-log-prefix drops both, as upstream.

The lifecycle lines (``main: server is listening on ...``) are not log
records: they are the readiness protocol on stdout and the runner prints them
whatever the log configuration (still through the redacting stdout).
"""

from __future__ import annotations

import errno
import io
import logging
import os
import re
import stat
import sys
import threading
import time
from collections.abc import Iterable
from typing import TextIO

import attrs

TRACE = 15
logging.addLevelName(TRACE, "TRACE")

REDACTED = "[redacted]"
MAX_PENDING = 1 << 20  # a "line" longer than this is released unterminated

# upstream's ANSI palette (common/log.h)
_RESET, _RED, _GREEN, _YELLOW, _BLUE, _MAGENTA = (
    "\033[0m", "\033[31m", "\033[32m", "\033[33m", "\033[34m", "\033[35m")

# -- destination ----------------------------------------------------------------


class LogFileError(Exception):
    """Why a log file cannot be used; str() is the reason, without the path."""


def open_log_file(path: str) -> TextIO:
    """Open `path` for appending, created (or tightened to) mode 0600.

    Refuses a symbolic link, a directory, a missing parent directory and
    anything the open itself refuses, each as a LogFileError."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise LogFileError(f"its parent directory {parent!r} does not exist")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise LogFileError(f"cannot be inspected ({exc.strerror})") from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise LogFileError("is a symbolic link; name the file itself")
        if stat.S_ISDIR(st.st_mode):
            raise LogFileError("is a directory; name a file")
    # O_NONBLOCK: a FIFO without a reader fails (ENXIO) instead of blocking
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK \
        | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LogFileError("is a symbolic link; name the file itself") from None
        raise LogFileError(f"cannot be opened for append ({exc.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise LogFileError("is not a regular file")
        os.fchmod(fd, 0o600)
        os.set_blocking(fd, True)
    except LogFileError:
        os.close(fd)
        raise
    except OSError as exc:
        os.close(fd)
        raise LogFileError(f"cannot be made private (mode 0600: {exc.strerror})") from None
    return open(fd, "a", encoding="utf-8", errors="backslashreplace", buffering=1)


# -- redaction ------------------------------------------------------------------


class Redactor:
    """Replaces every occurrence of every secret with [redacted]; the longest
    secret wins where two overlap."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        parts: set[str] = set()
        for secret in secrets:
            parts.update(line for line in str(secret).splitlines() if line)
        ordered = sorted(parts, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __call__(self, text: str) -> str:
        return self._pattern.sub(REDACTED, text) if self._pattern else text


class RedactingStream(io.TextIOBase):
    """A text stream that releases whole lines, redacted, to `raw`.

    Thread-safe (the engine thread logs too).  A partial line is held until
    its end arrives, `drain()` or close; flush() flushes what was released."""

    def __init__(self, raw: TextIO, redactor: Redactor) -> None:
        super().__init__()
        self.raw = raw
        self._redact = redactor
        self._pending = ""
        self._lock = threading.Lock()

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        with self._lock:
            data = self._pending + s
            cut = max(data.rfind("\n"), data.rfind("\r")) + 1
            if not cut and len(data) > MAX_PENDING:
                cut = len(data)
            if cut:
                self.raw.write(self._redact(data[:cut]))
            self._pending = data[cut:]
        return len(s)

    def drain(self) -> None:
        """Release a held partial line (at exit)."""
        with self._lock:
            if self._pending:
                self.raw.write(self._redact(self._pending))
                self._pending = ""
            self.raw.flush()

    def flush(self) -> None:
        with self._lock:
            self.raw.flush()

    def close(self) -> None:
        self.drain()
        super().close()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self.raw.isatty()

    def fileno(self) -> int:
        return self.raw.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.raw, "encoding", "utf-8")

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self.raw, "errors", None)


# -- format ---------------------------------------------------------------------


def level_for(threshold: int, verbose: bool) -> int:
    """Upstream's verbosity threshold as the lowest Python level shown."""
    if verbose or threshold >= 5:
        return logging.DEBUG
    return {4: TRACE, 3: logging.INFO, 2: logging.WARNING, 1: logging.ERROR}.get(
        threshold, logging.CRITICAL + 1)


def can_use_colors(stream: TextIO, env=os.environ) -> bool:
    """upstream's auto: NO_COLOR unset/empty, TERM not dumb, and a terminal."""
    if env.get("NO_COLOR"):
        return False
    if env.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class UpstreamFormatter(logging.Formatter):
    """``[M.SS.mmm.uuu ][L ]name: message`` with upstream's letters and colors."""

    def __init__(self, *, prefix: bool, timestamps: bool, colors: bool, t_start: float) -> None:
        super().__init__()
        self.prefix = prefix
        self.timestamps = timestamps
        self.t_start = t_start
        self.col = (lambda c: c) if colors else (lambda c: "")

    def _stamp(self, created: float) -> str:
        us = max(0, round((created - self.t_start) * 1_000_000))
        return (f"{self.col(_BLUE)}{us // 60_000_000}.{us // 1_000_000 % 60:02d}."
                f"{us // 1000 % 1000:03d}.{us % 1000:03d}{self.col(_RESET)} ")

    def format(self, record: logging.LogRecord) -> str:
        text = f"{record.name}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            text += "\n" + self.formatStack(record.stack_info)
        if not self.prefix:
            return text
        head = self._stamp(record.created) if self.timestamps else ""
        if record.levelno >= logging.ERROR:
            return f"{head}{self.col(_RED)}E {text}{self.col(_RESET)}"
        if record.levelno >= logging.WARNING:
            return f"{head}{self.col(_MAGENTA)}W {text}{self.col(_RESET)}"
        if record.levelno >= TRACE:
            return f"{head}{self.col(_GREEN)}I {self.col(_RESET)}{text}"
        return f"{head}{self.col(_YELLOW)}D {text}{self.col(_RESET)}"


# -- installation -------------------------------------------------------------------


@attrs.frozen
class LogPlan:
    """What `install` sets up; built from the ServerConfig."""

    disabled: bool = False
    file: str | None = None        # None: standard output
    threshold: int = 3
    verbose: bool = False
    colors: str = "auto"           # "on" | "off" | "auto"
    prefix: bool = True
    timestamps: bool = True
    secrets: tuple[str, ...] = attrs.field(default=(), repr=False)


@attrs.define
class Installed:
    """The streams `install` put in place; `close()` drains them at exit."""

    streams: list[RedactingStream]
    to_file: bool

    def close(self) -> None:
        logging.shutdown()
        for stream in self.streams:
            try:
                stream.drain()
            except (OSError, ValueError):
                pass


class FileSinkHandler(logging.StreamHandler):
    """The --log-file handler: a write that fails (a full disk: ENOSPC, a
    removed mount) is said once on stderr, with the file and the reason, and
    the lines are dropped until a write succeeds again (then that is said
    too), instead of logging's traceback for every record; the server goes
    on serving either way."""

    def __init__(self, stream, path: str) -> None:
        super().__init__(stream)
        self.path = path
        self.failing = False

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        if self.failing and not self._errored:
            self.failing = False
            sys.stderr.write(f"warning: --log-file {self.path}: writable again; "
                             "the lines in between were dropped\n")
        self._errored = False

    def handleError(self, record: logging.LogRecord) -> None:
        self._errored = True
        if self.failing:
            return
        self.failing = True
        exc = sys.exc_info()[1]
        reason = getattr(exc, "strerror", None) or exc
        sys.stderr.write(f"error: --log-file {self.path}: cannot write ({reason}); log "
                         "lines are dropped until it can; the server goes on serving\n")

    _errored = False


def install(plan: LogPlan) -> Installed:
    """Wrap stdout/stderr in redaction, then install the one log handler."""
    redactor = Redactor(plan.secrets)
    out = RedactingStream(sys.stdout, redactor)
    err = RedactingStream(sys.stderr, redactor)
    sys.stdout, sys.stderr = out, err
    streams = [out, err]
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    if plan.disabled:
        logging.disable(logging.CRITICAL)  # no subscriber: nothing is formatted
        return Installed(streams, to_file=False)
    if plan.file is not None:
        sink = RedactingStream(open_log_file(plan.file), redactor)
        streams.append(sink)
    else:
        sink = out
    colors = plan.colors == "on" or (plan.colors == "auto" and can_use_colors(sink))
    handler = (logging.StreamHandler(sink) if plan.file is None
               else FileSinkHandler(sink, plan.file))
    handler.setFormatter(UpstreamFormatter(prefix=plan.prefix, timestamps=plan.timestamps,
                                           colors=colors, t_start=time.time()))
    level = level_for(plan.threshold, plan.verbose)
    root.addHandler(handler)
    root.setLevel(level)
    # hypercorn announces its binds at info; ours are the lifecycle lines
    logging.getLogger("hypercorn").setLevel(max(level, logging.WARNING) if level > TRACE
                                            else level)
    logging.captureWarnings(True)
    return Installed(streams, to_file=plan.file is not None)

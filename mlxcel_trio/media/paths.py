"""file:// media references, confined to the --media-path root.

The resolution rule, as llama-server b10621 has it and as mlxcel extends it:

1. Without a root, every file:// reference is refused with upstream's
   sentence.
2. The reference (what follows ``file://``) passes upstream's
   fs_validate_filename(allow_subdirs=true) name check, plus a refusal of
   percent escapes for ``.``, ``/``, ``\\`` and NUL.  Nothing is
   percent-decoded: upstream never decodes, so ``%2e%2e`` would be a literal
   name there; refusing it makes the no-traversal property checked here
   rather than inherited from a decode nobody does.
3. Relative first, by concatenation: the root plus the reference with its
   leading separators stripped (``os.path.join`` with an absolute second
   part would drop the root and turn the feature into an arbitrary read).
   The result is canonicalized and must stay inside the canonical root, so
   a symlink inside the root that points inside it resolves and one that
   leaves it is refused as an escape.
4. Absolute fallback: when the concatenated candidate does not exist and
   the reference is absolute, the reference itself is canonicalized and put
   through the same containment check.  A reference outside the root is an
   escape whether or not the file exists, so the answer never reveals what
   exists outside the root.
5. The open walks the canonical path one component at a time from the root
   with O_NOFOLLOW, so a component swapped for a symlink between the check
   and the open fails with ELOOP instead of being followed; the file must be
   a regular file (checked before the open, so no device is opened, and
   again with fstat after it; FIFOs are opened non-blocking and refused) and
   is read only up to the byte budget.

The candidate path is logged at debug only: it spells out the root, which
the response never does.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat

from .errors import MediaError, too_large

log = logging.getLogger("mlxcel.media")

NO_MEDIA_PATH = "file:// URLs are not allowed unless --media-path is specified"
MAX_PATH_BYTES = 255  # upstream's cap, on the whole reference, before either form is tried

# Unicode look-alikes of '.', '/', '\\', and the two markers of mangled text
_LOOKALIKES = frozenset({0xFF0E, 0x2215, 0x2216, 0xFFFD, 0xFEFF})
_FORBIDDEN_ASCII = frozenset(':*?"<>|')
_ENCODED_TRAVERSAL = re.compile(r"%(?:2e|2f|5c|00)", re.IGNORECASE)


def not_allowed(reference: str) -> MediaError:
    return MediaError(f"file path is not allowed: {reference}")


def escapes(reference: str) -> MediaError:
    return MediaError(f"file path escapes the --media-path root: {reference}")


def missing(reference: str) -> MediaError:
    return MediaError(f"file does not exist or cannot be opened: {reference} "
                      "(file:// paths resolve inside the --media-path directory)")


def valid_name(reference: str) -> bool:
    """upstream's fs_validate_filename(reference, allow_subdirs=true), plus
    the percent-escape refusal (module docstring, rule 2)."""
    try:
        raw = reference.encode("utf-8")  # a lone surrogate cannot be encoded: refused
    except UnicodeEncodeError:
        return False
    if not raw or len(raw) > MAX_PATH_BYTES:
        return False
    for ch in reference:
        c = ord(ch)
        if (c <= 0x1F or c == 0x7F or 0x80 <= c <= 0x9F or c in _LOOKALIKES
                or 0xD800 <= c <= 0xDFFF or ch in _FORBIDDEN_ASCII):
            return False
    if reference[0] == " " or reference[-1] in (" ", "."):
        return False
    if ".." in reference or reference == ".":
        return False
    return _ENCODED_TRAVERSAL.search(reference) is None


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root if root.endswith(os.sep) else root + os.sep)


def _canonical(path: str) -> str | None:
    """The canonical path, or None when it does not resolve."""
    try:
        return os.path.realpath(path, strict=True)
    except (OSError, RuntimeError):  # missing, not a directory, a symlink loop
        return None


def resolve(reference: str, root: str) -> str:
    """The canonical path inside `root` that `reference` names (rules 2-4);
    `root` must be canonical (the option canonicalizes it at startup)."""
    if not valid_name(reference):
        raise not_allowed(reference)
    candidate = os.path.join(root, reference.lstrip("/"))
    log.debug("media file reference %r probes %s", reference, candidate)
    real = _canonical(candidate)
    if real is not None:
        if not _inside(real, root):
            raise escapes(reference)
        return real
    if os.path.isabs(reference):
        real = _canonical(reference)
        if real is not None:
            if not _inside(real, root):
                raise escapes(reference)
            return real
        if not _inside(os.path.normpath(reference), root):
            raise escapes(reference)
    raise missing(reference)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_confined(real: str, root: str, reference: str) -> int:
    """Open `real` (canonical, inside `root`) walking down from the root
    with O_NOFOLLOW on every component: a swapped-in symlink fails with
    ELOOP (or ENOTDIR for a directory component) rather than being followed."""
    rel = os.path.relpath(real, root)
    parts = [] if rel == "." else rel.split(os.sep)
    if not parts:
        raise not_allowed(reference)  # the root itself: a directory
    try:
        dirfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:  # the root itself went away after startup
        raise missing(reference) from None
    try:
        for part in parts[:-1]:
            nxt = os.open(part, _DIR_FLAGS, dir_fd=dirfd)
            os.close(dirfd)
            dirfd = nxt
        return os.open(parts[-1], _FILE_FLAGS, dir_fd=dirfd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO, errno.EISDIR):
            raise not_allowed(reference) from None  # swapped for a link; a socket
        raise missing(reference) from None
    finally:
        os.close(dirfd)


def _read_bounded(fd: int, max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > max_bytes:
            raise too_large("the media file", max_bytes)
        chunks.append(chunk)


def _is_regular(path: str, reference: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        raise missing(reference) from None


def read_file(reference: str, root: str | None, max_bytes: int) -> bytes:
    """The bytes of the regular file `reference` (a file:// URL less its
    scheme) names inside `root`, at most `max_bytes` of them.  Blocking:
    call it from a worker thread (read_media does)."""
    if not root:
        raise MediaError(NO_MEDIA_PATH)
    root = os.path.realpath(root)
    real = resolve(reference, root)
    if not _is_regular(real, reference):
        raise not_allowed(reference)  # a directory, FIFO, socket or device: never opened
    fd = open_confined(real, root, reference)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # replaced between the stat and the open
            raise not_allowed(reference)
        if info.st_size > max_bytes:
            raise too_large("the media file", max_bytes)
        return _read_bounded(fd, max_bytes)
    finally:
        os.close(fd)

"""POST /slots/:id_slot?action=save|restore|erase (with --slot-save-path).

What a slot file holds is the slot's token stream (the last request's prompt
and generated tokens) plus the identity of the model and tokenizer that
produced it, not a KV image: a KV image would bind the file to one cache
layout, where tokens restore under any and rebuild the same KV by prefilling.
So a restore puts the tokens back as the slot's stream, and the next request
that starts with them re-evaluates them (or adopts them from the prompt cache
if it still holds them).

File names follow upstream's fs_validate_filename rule for rule.  On top of
it the path is confined: the name is joined to the canonical save directory,
must still resolve inside it (a symlink pointing out is refused as an
invalid filename), and is opened without following a final symlink.  Saves
are atomic (a temporary file in the same directory, fsync, rename), so a
reader never sees half a file.  A slot that is serving a request answers
503, where upstream would defer the action until the slot frees.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from quart import request

from ...bridge import Bridge
from ...protocol.records import Failed, SlotTokens
from ..http.body import read_json_body
from ..request.jobs import namespace, namespace_kind
from ..http.errors import ApiError, json_response, json_type_name

log = logging.getLogger("mlxcel.slots")

FORMAT = "mlxcel-trio-slot"
VERSION = 1
MAX_FILE_BYTES = 64 * 1024 * 1024
INVALID_FILE = "No available space in KV cache or invalid slot save file"
# files whose bytes define the model / the tokenizer, hashed for the binding
MODEL_FILES = ("config.json",)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "tokenizer.model")


# -- fs_validate_filename ---------------------------------------------------------

_FORBIDDEN = frozenset(map(ord, ':*?"<>|/\\'))


def _forbidden(c: int) -> bool:
    return (c <= 0x1F or c == 0x7F or 0x80 <= c <= 0x9F or c in (0xFF0E, 0x2215, 0x2216)
            or 0xD800 <= c <= 0xDFFF or c > 0x10FFFF or c in (0xFFFD, 0xFEFF)
            or c in _FORBIDDEN)


def valid_filename(name: str) -> bool:
    """upstream's fs_validate_filename(name, allow_subdirs=false): at most 255
    UTF-8 bytes, no control / look-alike / reserved characters, no path
    separator, no leading or trailing space, no trailing dot, no "..", not "."."""
    raw = name.encode("utf-8", "surrogatepass")
    if not raw or len(raw) > 255:
        return False
    if any(_forbidden(ord(ch)) for ch in name):
        return False
    if name[0] == " " or name[-1] in (" ", "."):
        return False
    return ".." not in name and name != "."


def confined(root: str, name: str) -> str | None:
    """The path for `name` inside the canonical `root`, or None when it would
    resolve anywhere else (a symlink pointing out of the directory)."""
    path = os.path.join(root, name)
    real = os.path.realpath(path)
    if os.path.dirname(real) != root:
        return None
    return path if real == path else real


# -- identity -----------------------------------------------------------------------


def _digest(folder: Path, names: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for name in names:
        p = folder / name
        if p.is_file():
            h.update(name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def identity(model_path: str, cache: dict[str, dict[str, str]]) -> dict[str, str]:
    """What a slot file is bound to: the model's config and the tokenizer's
    files, by content (the path may differ between save and restore).
    `cache` (the app's, server/state.py) keeps it per model path."""
    hit = cache.get(model_path)
    if hit is None:
        folder = Path(model_path)
        hit = {"model": _digest(folder, MODEL_FILES),
               "tokenizer": _digest(folder, TOKENIZER_FILES)}
        cache[model_path] = hit
    return hit


# -- file I/O (worker thread) ---------------------------------------------------------

def write_atomic(root: str, path: str, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in `root` and a rename:
    a reader sees the old file or the whole new one, and a symlink planted
    under the name is replaced, never written through."""
    fd, tmp = tempfile.mkstemp(dir=root, prefix=".slot-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # replaces a symlink itself, never its target
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_file(path: str) -> bytes | None:
    """The file's bytes, or None for anything but a regular file within the
    size bound (O_NONBLOCK: opening a FIFO planted under the name must not
    block the worker thread; fstat then refuses it, or a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError:
        return None
    return None if len(data) > MAX_FILE_BYTES else data


def _read_decoded(path: str, ident: dict[str, str]):
    data = read_file(path)
    return data, _decode(data, ident)


def _decode(data: bytes | None, ident: dict[str, str]
            ) -> tuple[tuple[int, ...], str | None] | None:
    """The file's tokens and prompt kind, or None if it is not a slot file of
    this model and tokenizer."""
    if data is None:
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        return None
    if doc.get("model") != ident["model"] or doc.get("tokenizer") != ident["tokenizer"]:
        return None
    tokens = doc.get("tokens")
    if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        return None
    kind = doc.get("prompt_kind")
    return tuple(tokens), kind if isinstance(kind, str) and kind else None


# -- the route -------------------------------------------------------------------------

async def _engine(bridge: Bridge, id_slot: int, tokens: tuple[int, ...] | None,
                  cache_ns: str | None = None) -> SlotTokens:
    ev = await bridge.slot_action(id_slot, tokens, cache_ns)
    if isinstance(ev, Failed):
        raise ApiError.from_failed(ev)
    return ev


def _filename(body: Any) -> str:
    if not isinstance(body, dict) or "filename" not in body:
        raise ApiError("[json.exception.out_of_range.403] key 'filename' not found",
                       "server_error")
    name = body["filename"]
    if not isinstance(name, str):
        raise ApiError("[json.exception.type_error.302] type must be string, but is "
                       f"{json_type_name(name)}", "server_error")
    return name


def _path_for(root: str, name: str) -> str:
    path = confined(root, name) if valid_filename(name) else None
    if path is None:
        raise ApiError("Invalid filename")
    return path


async def handle(bridge: Bridge, root: str, raw_id: str,
                 identities: dict[str, dict[str, str]]):
    """post_slots: id (`raw_id`, the path's), then action, then the
    action's own checks."""
    try:
        id_slot = stoi(raw_id)
    except ValueError:
        raise ApiError("Invalid slot ID") from None
    action = request.args.get("action", "")
    if action not in ("save", "restore", "erase"):
        raise ApiError("Invalid action")
    if action == "erase":
        ev = await _engine(bridge, id_slot, ())
        return json_response({"id_slot": id_slot, "n_erased": ev.previous})
    name = _filename(await read_json_body(request))
    path = _path_for(root, name)
    ident = await trio.to_thread.run_sync(identity, bridge.info.path, identities)
    t0 = time.perf_counter()
    if action == "save":
        ev = await _engine(bridge, id_slot, None)
        data = json.dumps({"format": FORMAT, "version": VERSION, **ident,
                           "prompt_kind": namespace_kind(ev.cache_ns),
                           "tokens": list(ev.tokens)}, separators=(",", ":")).encode()
        try:
            await trio.to_thread.run_sync(write_atomic, root, path, data)
        except OSError as exc:  # upstream's answer; the reason (a full disk) goes to the log
            log.error("slot %d: saving %s failed: %s", id_slot, name, exc.strerror or exc)
            raise ApiError("Unable to save slot", "server_error") from None
        return json_response({"id_slot": id_slot, "filename": name, "n_saved": len(ev.tokens),
                              "n_written": len(data),
                              "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}})
    await _engine(bridge, id_slot, None)  # slot id and busy first, as upstream's order
    # a slot file may be large: read and decode it off the event loop
    data, decoded = await trio.to_thread.run_sync(_read_decoded, path, ident)
    if decoded is None:
        raise ApiError(f"Unable to restore slot: {INVALID_FILE}")
    tokens, kind = decoded
    # the engine re-evaluates the tokens into the prompt cache under the
    # namespace they were cached under (raw, or the same chat template)
    ev = await _engine(bridge, id_slot, tokens,
                       None if kind is None else namespace(bridge.info.path, kind))
    return json_response({"id_slot": id_slot, "filename": name, "n_restored": len(ev.tokens),
                          "n_read": len(data),
                          "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}})


def stoi(text: str) -> int:
    """std::stoi: optional leading whitespace and sign, then digits; the rest
    of the string is ignored; out of int range throws."""
    s = text.lstrip(" \t\n\r\f\v")
    i = 1 if s[:1] in ("+", "-") else 0
    j = i
    while j < len(s) and s[j].isdigit() and s[j].isascii():
        j += 1
    if j == i:
        raise ValueError(text)
    value = int(s[:j])
    if not -(2**31) <= value < 2**31:
        raise ValueError(text)
    return value

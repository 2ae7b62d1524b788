"""Fetching MLX checkpoints from the Hugging Face Hub into its cache.

One function, `fetch`, serves `-m owner/name`, `mlxcel download` and the
router's `POST /models`.  It honours HF_ENDPOINT, HF_HUB_OFFLINE and
HF_TOKEN / a token argument the way huggingface_hub does, and adds:

- progress in bytes (done, total, rate, ETA) through a callback, from the
  file sizes the Hub lists and the bytes on disk so far;
- all or nothing: the snapshot is downloaded into a staging folder inside
  the cache and moved into place only once every file is there, so a
  download that fails (404, 401, a dropped connection) leaves no
  half snapshot that a later load would take for a checkpoint;
- one line naming the real cause when it fails (`DownloadError`).

The standard library and attrs at import; huggingface_hub only when called.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, TextIO
from urllib.parse import urlsplit

import attrs

from .model_store import hub_cache_dir, is_checkpoint, newest_snapshot

# What an MLX checkpoint needs from a Hub snapshot: configs, weights,
# tokenizer files and chat templates; GGUF or PyTorch blobs stay behind.
ALLOW_PATTERNS = (
    "*.json", "*.safetensors", "*.py", "*.txt", "*.jsonl", "*.jinja",
    "*.model", "*.tiktoken",
)
STAGING = ".mlxcel-staging"
POLL_S = 0.25
REACH_TIMEOUT_S = 5.0   # the one connection attempt that tells an offline machine


class DownloadError(Exception):
    """A download that failed; str() is one line naming the cause."""


@attrs.frozen
class Progress:
    done: int                 # bytes on disk so far
    total: int                # bytes the Hub lists for the files to fetch
    rate: float               # bytes per second since the start
    eta: float | None         # seconds left at that rate

    def to_json(self) -> dict:
        return {"done": self.done, "total": self.total, "rate": round(self.rate),
                "eta": None if self.eta is None else round(self.eta, 1)}


def repo_dir(cache: Path, repo_id: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def removable(cache: Path, repo_id: str) -> Path | None:
    """The repository's folder when deleting it stays inside the cache: not
    a link, and directly in the cache folder; None otherwise."""
    repo = repo_dir(cache, repo_id)
    if repo.is_symlink() or repo.resolve().parent != cache.resolve():
        return None
    return repo


def fetch(repo_id: str, *, token: str | None = None, cache: Path | None = None,
          on_progress: Callable[[Progress], None] | None = None) -> Path:
    """The snapshot directory of `repo_id`: from the cache when it is there,
    else downloaded (all or nothing).  Raises DownloadError."""
    cache = cache or hub_cache_dir(os.environ)
    found = newest_snapshot(repo_dir(cache, repo_id))
    if found is not None:
        return found
    try:
        from huggingface_hub import HfApi, constants, snapshot_download
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise DownloadError(f"huggingface_hub is unavailable ({exc})") from None
    if constants.HF_HUB_OFFLINE:
        raise DownloadError("not in the local Hugging Face cache, and downloading is off "
                            "(HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE or --offline is set); download "
                            "it once where the "
                            "Hub is reachable, or pass a local checkpoint directory")
    unreachable = _unreachable(constants.ENDPOINT)
    if unreachable:  # before huggingface_hub's retries (about 24 s of them)
        raise DownloadError(f"not in the local Hugging Face cache, and the Hub cannot be "
                            f"reached ({unreachable}); connect to the network, or set "
                            "HF_HUB_OFFLINE=1 (or pass --offline) to serve from the cache "
                            "only, or pass a local checkpoint directory")
    try:
        total = sum(f.size or 0 for f in HfApi(token=token).list_repo_tree(repo_id, recursive=True)
                    if getattr(f, "size", None) is not None and _wanted(f.path))
    except Exception as exc:
        raise DownloadError(hub_failure(exc)) from None
    if on_progress is not None:  # ours replaces huggingface_hub's per-file bars
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    t0 = time.monotonic()
    staging = cache / STAGING / uuid.uuid4().hex
    staging.mkdir(parents=True, exist_ok=True)
    done = threading.Event()
    watcher = threading.Thread(target=_watch, args=(staging, total, on_progress, done),
                               daemon=True) if on_progress else None
    try:
        if watcher:
            watcher.start()
        snapshot = Path(snapshot_download(repo_id, allow_patterns=list(ALLOW_PATTERNS),
                                          cache_dir=str(staging), token=token))
        if not is_checkpoint(snapshot):
            raise DownloadError(f"the repository {repo_id} holds no MLX checkpoint "
                                "(config.json and *.safetensors)")
        final = _publish(staging, cache, repo_id, snapshot)
    except DownloadError:
        raise
    except Exception as exc:
        raise DownloadError(hub_failure(exc)) from None
    finally:
        done.set()
        if watcher:
            watcher.join(5)
        shutil.rmtree(staging, ignore_errors=True)
    if on_progress:
        elapsed = time.monotonic() - t0
        on_progress(Progress(total, total, total / elapsed if elapsed > 0 else 0.0, 0.0))
    return final


def _unreachable(endpoint: str) -> str | None:
    """Why a TCP connection to the Hub's endpoint fails right now (no
    network, no DNS, refused), or None when it connects.  One bounded try:
    an offline machine learns it at once instead of through retries."""
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=REACH_TIMEOUT_S):
            return None
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or type(exc).__name__}"


def probe(repo_id: str, token: str | None = None) -> None:
    """The Hub knows `repo_id` (and lets this token read it); else DownloadError."""
    from huggingface_hub import HfApi

    try:
        HfApi(token=token).model_info(repo_id)
    except Exception as exc:
        raise DownloadError(hub_failure(exc)) from None


def _wanted(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(path, p) for p in ALLOW_PATTERNS)


def _watch(staging: Path, total: int, on_progress, done: threading.Event) -> None:
    t0 = time.monotonic()
    while not done.wait(POLL_S):
        size = 0
        for root, _dirs, files in os.walk(staging):
            for f in files:
                try:
                    size += os.lstat(os.path.join(root, f)).st_size
                except OSError:
                    pass
        elapsed = time.monotonic() - t0
        rate = size / elapsed if elapsed > 0 else 0.0
        eta = (total - size) / rate if rate > 0 and total >= size else None
        on_progress(Progress(min(size, total) if total else size, total, rate, eta))


def _publish(staging: Path, cache: Path, repo_id: str, snapshot: Path) -> Path:
    """Move the staged repository into the cache: blobs first, then the
    snapshot links and refs, so a reader never sees a link to a missing blob."""
    source = repo_dir(staging, repo_id)
    target = repo_dir(cache, repo_id)
    for part in ("blobs", "snapshots", "refs"):
        src = source / part
        if not src.is_dir():
            continue
        for root, dirs, files in os.walk(src):
            rel = Path(root).relative_to(source)
            (target / rel).mkdir(parents=True, exist_ok=True)
            for f in files:
                os.replace(Path(root) / f, target / rel / f)
    return target / snapshot.relative_to(source)


# -- failures -------------------------------------------------------------------

def first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def hub_failure(exc: BaseException) -> str:
    """One line naming the real cause: the HTTP status the Hub answered
    (401 needs a token, 404 is no such repository), else the error itself."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if status == 401:
        return ("could not fetch it from Hugging Face: 401 Unauthorized: the repository is "
                "private or gated; pass --hf-token or set HF_TOKEN")
    if status == 404:
        return ("could not fetch it from Hugging Face: 404 Not Found: no such repository "
                "(check the owner/name spelling)")
    prefix = f"HTTP {status}: " if status else f"{type(exc).__name__}: "
    return "could not fetch it from Hugging Face: " + prefix + first_line(exc)


# -- the terminal's progress bar ---------------------------------------------------

def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


class TerminalBar:
    """Progress on stderr: one line redrawn in place on a terminal, a line
    per tenth otherwise (a log or a pipe)."""

    def __init__(self, repo_id: str, stream: TextIO | None = None) -> None:
        self.repo_id = repo_id
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._tenth = -1

    def __call__(self, p: Progress) -> None:
        pct = 100 * p.done / p.total if p.total else 100.0
        eta = f", ETA {p.eta:.0f} s" if p.eta is not None and p.done < p.total else ""
        line = (f"downloading {self.repo_id}: {_size(p.done)} / {_size(p.total)} "
                f"({pct:.0f}%), {_size(p.rate)}/s{eta}")
        if self.tty:
            self.stream.write("\r" + line + ("\n" if p.done >= p.total else ""))
        elif int(pct // 10) > self._tenth:
            self._tenth = int(pct // 10)
            self.stream.write(line + "\n")
        self.stream.flush()

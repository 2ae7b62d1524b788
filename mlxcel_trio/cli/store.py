"""`mlxcel download | list | rm`: the local model store (the Hugging Face
cache that `-m owner/name` and router mode read).

    mlxcel download owner/name [--hf-token TOKEN]   fetch an MLX snapshot, with progress
    mlxcel list                                       the MLX checkpoints in the cache
    mlxcel rm owner/name                              delete one from the cache
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Sequence

from mlxcel_trio import downloads
from mlxcel_trio.model_store import cached_snapshots, hub_cache_dir

USAGE = __doc__.split("\n\n", 1)[1]


def _size(path: Path) -> int:
    """Bytes of the files a snapshot links to (blobs are counted once)."""
    seen, total = set(), 0
    for f in path.rglob("*"):
        real = f.resolve()
        if real.is_file() and real not in seen:
            seen.add(real)
            total += real.stat().st_size
    return total


def _facts(snapshot: Path) -> tuple[str, str]:
    try:
        config = json.loads((snapshot / "config.json").read_text())
    except (OSError, ValueError):
        return "?", "?"
    quant = config.get("quantization") or config.get("quantization_config") or {}
    dtype = (f"{quant['bits']}-bit" if isinstance(quant, dict) and "bits" in quant
             else str(config.get("torch_dtype") or config.get("dtype") or "?"))
    return str(config.get("model_type", "?")), dtype


def list_models(env=os.environ) -> str:
    rows = []
    for name, snapshot in cached_snapshots(env).items():
        arch, dtype = _facts(snapshot)
        rows.append((name, f"{_size(snapshot) / 2**20:,.1f} MiB", arch, dtype))
    if not rows:
        return f"no MLX checkpoints in {hub_cache_dir(env)}\n"
    widths = [max(len(r[i]) for r in rows + [("MODEL", "SIZE", "ARCHITECTURE", "DTYPE")])
              for i in range(4)]
    lines = [("MODEL", "SIZE", "ARCHITECTURE", "DTYPE"), *rows]
    return "".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n"
                   for r in lines)


def main(command: str, argv: Sequence[str]) -> int:
    args = list(argv)
    if command == "list":
        if args:
            print(f"error: mlxcel list takes no arguments\n{USAGE}", file=sys.stderr)
            return 1
        sys.stdout.write(list_models())
        return 0
    token = None
    if "--hf-token" in args:
        i = args.index("--hf-token")
        token = args[i + 1] if i + 1 < len(args) else None
        del args[i:i + 2]
    if len(args) != 1 or not downloads_repo_id(args[0]):
        print(f"error: mlxcel {command} takes one Hugging Face repo id (owner/name)\n{USAGE}",
              file=sys.stderr)
        return 1
    repo_id = args[0]
    if command == "download":
        try:
            path = downloads.fetch(repo_id, token=token or os.environ.get("HF_TOKEN") or None,
                                   on_progress=downloads.TerminalBar(repo_id))
        except downloads.DownloadError as exc:
            print(f"error: {repo_id}: {exc}", file=sys.stderr)
            return 1
        print(path)
        return 0
    cache = hub_cache_dir(os.environ)
    repo = downloads.removable(cache, repo_id)
    if repo is None or not repo.is_dir():
        print(f"error: {repo_id} is not in the cache ({cache})", file=sys.stderr)
        return 1
    shutil.rmtree(repo)
    print(f"removed {repo_id} ({repo})")
    return 0


def downloads_repo_id(value: str) -> bool:
    from mlxcel_trio.cli.model_ref import looks_like_repo_id

    return looks_like_repo_id(value) and ".." not in value

"""Where MLX checkpoints live on this machine: the Hugging Face hub cache.

Shared by the command line (`--cache-list`) and the router (its "cache"
model source); the standard library only, so either side may import it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping


def hub_cache_dir(env: Mapping[str, str]) -> Path:
    """The model store: --model-store-root / MLXCEL_MODELS_DIR (or
    MLXCEL_CACHE_DIR), else where huggingface_hub keeps its cache, by its
    own precedence."""
    for var in ("MLXCEL_MODELS_DIR", "MLXCEL_CACHE_DIR", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(var):
            return Path(env[var]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    base = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or "~", ".cache")
    return Path(base).expanduser() / "huggingface" / "hub"


def is_checkpoint(path: Path) -> bool:
    """A directory holding an MLX (SafeTensors) checkpoint."""
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def newest_snapshot(repo: Path) -> Path | None:
    """The newest snapshot of a cache repository folder that holds a checkpoint."""
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    usable = [s for s in snapshots.iterdir() if is_checkpoint(s)]
    return max(usable, key=lambda s: s.stat().st_mtime) if usable else None


def cached_snapshots(env: Mapping[str, str]) -> dict[str, Path]:
    """Repo id -> its newest snapshot holding an MLX checkpoint, for every
    repository in the hub cache that has one."""
    root = hub_cache_dir(env)
    found: dict[str, Path] = {}
    try:
        repos = sorted(root.glob("models--*"))
    except OSError:
        return found
    for repo in repos:
        snapshot = newest_snapshot(repo)
        if snapshot is not None:
            found[repo.name.removeprefix("models--").replace("--", "/", 1)] = snapshot
    return found


def cached_models(env: Mapping[str, str]) -> list[str]:
    """Repo ids in the hub cache with at least one MLX checkpoint snapshot."""
    return list(cached_snapshots(env))

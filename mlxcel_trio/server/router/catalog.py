"""Which models a router can serve, by upstream's precedence (a later source
wins a name): the Hugging Face cache (`owner/name`, source "cache"), then
each direct subdirectory of --models-dir that holds a config.json (named by
the directory, source "models_dir").  A subdirectory that is a symlink
resolving outside --models-dir is skipped: the directory is the boundary an
operator drew."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping

import attrs

from ...model_store import cached_snapshots

log = logging.getLogger("mlxcel.router")


@attrs.frozen
class ModelEntry:
    name: str
    path: Path
    source: str            # "cache" | "models_dir"


def discover(models_dir: str | None, env: Mapping[str, str]) -> dict[str, ModelEntry]:
    found = {name: ModelEntry(name, path, "cache")
             for name, path in cached_snapshots(env).items()}
    if models_dir:
        root = Path(models_dir).resolve()
        try:
            children = sorted(root.iterdir())
        except OSError as exc:
            log.warning("--models-dir %s cannot be listed: %s", root, exc)
            children = []
        for child in children:
            real = child.resolve()
            if not real.is_relative_to(root):
                log.warning("skipping %s: it resolves outside --models-dir (%s)", child.name, real)
                continue
            if real.is_dir() and (real / "config.json").is_file():
                found[child.name] = ModelEntry(child.name, real, "models_dir")
    return found

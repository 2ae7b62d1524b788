"""Which models a router can serve, by upstream's precedence (a later source
wins a name): the Hugging Face cache (`owner/name`, source "cache"), then
each direct subdirectory of --models-dir that holds a config.json (named by
the directory, source "models_dir"), then --models-preset sections.  A
subdirectory that is a symlink resolving outside --models-dir is skipped:
the directory is the boundary an operator drew.  A preset section naming a
discovered model adds its options, aliases and tags to it; one with
`model =` (a directory) or `hf-repo =` (a cache snapshot) defines a model
of source "preset"."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

import attrs

from ...model_store import cached_snapshots

log = logging.getLogger("mlxcel.router")


@attrs.frozen
class ModelEntry:
    name: str
    path: Path
    source: str                         # "cache" | "models_dir" | "preset"
    args: tuple[str, ...] = ()          # its preset's options (cli/presets.py)
    aliases: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    load_on_startup: bool = False


def discover(models_dir: str | None, env: Mapping[str, str],
             presets: Sequence[Any] = ()) -> dict[str, ModelEntry]:
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
    cache = None
    for p in presets:
        extra = dict(args=p.args, aliases=p.aliases, tags=p.tags,
                     load_on_startup=p.load_on_startup)
        if p.model:
            found[p.name] = ModelEntry(p.name, Path(p.model).expanduser().resolve(), "preset",
                                       **extra)
        elif p.hf_repo:
            cache = cached_snapshots(env) if cache is None else cache
            if p.hf_repo in cache:
                found[p.name] = ModelEntry(p.name, cache[p.hf_repo], "preset", **extra)
            else:
                log.warning("preset %s: %s is not in the Hugging Face cache; skipped",
                            p.name, p.hf_repo)
        elif p.name in found:
            found[p.name] = attrs.evolve(found[p.name], **extra)
        else:
            log.warning("preset %s names no discovered model and has no model or hf-repo "
                        "key; skipped", p.name)
    return found

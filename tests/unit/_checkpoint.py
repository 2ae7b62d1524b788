"""A directory that passes the checkpoint shape check without being
loadable: enough for the cli and settings tests, which never load a model."""

from __future__ import annotations

import json
from pathlib import Path


def fake_checkpoint(path: Path, config: dict | None = None) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config or {}))
    (path / "model.safetensors").write_bytes(b"")
    return path

"""Fixtures for the cli tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A directory that passes the checkpoint shape check (not loadable)."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"")
    return ckpt

"""Fixtures for the cli tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from .._checkpoint import fake_checkpoint


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A directory that passes the checkpoint shape check (not loadable)."""
    return fake_checkpoint(tmp_path / "ckpt")

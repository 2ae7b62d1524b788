"""--media-path, --max-image-payload-size and --max-images: validated at
startup (before the model resolves) and carried into the configuration."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mlxcel_trio.cli.main import prepare
from mlxcel_trio.cli.parser import CliError
from mlxcel_trio.media import DEFAULT_MAX_IMAGES, DEFAULT_MAX_PAYLOAD

from .._checkpoint import fake_checkpoint


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    return fake_checkpoint(tmp_path / "ckpt", {"num_hidden_layers": 4})


def config_of(argv: list[str], ckpt: Path):
    return prepare([*argv, "-m", str(ckpt)], env={})


def refusal(argv: list[str]) -> str:
    # the model does not exist: a refusal proves the check runs before it resolves
    with pytest.raises(CliError) as info:
        prepare([*argv, "-m", "/nonexistent/model"], env={})
    return str(info.value)


def test_defaults(ckpt):
    config = config_of([], ckpt)
    assert config.media_path is None
    assert config.max_image_payload_size == DEFAULT_MAX_PAYLOAD == 20 * 1024 * 1024
    assert config.max_images == DEFAULT_MAX_IMAGES == 16


def test_the_media_path_is_made_canonical(ckpt, tmp_path):
    media = tmp_path / "media"
    media.mkdir()
    os.symlink(media, tmp_path / "link")
    config = config_of(["--media-path", str(tmp_path / "link"), "--max-images", "2",
                        "--max-image-payload-size", "1000"], ckpt)
    assert config.media_path == os.path.realpath(media)
    assert (config.max_images, config.max_image_payload_size) == (2, 1000)


@pytest.mark.parametrize("argv, words", [
    (["--media-path", "/nonexistent/media"],
     "invalid value '/nonexistent/media' for --media-path: not a directory: "
     "/nonexistent/media; expected an existing directory"),
    (["--media-path", __file__], "for --media-path: not a directory"),
    (["--max-images", "0"], "invalid value '0' for --max-images: out of range; "
                            "expected an integer in [1, 4096]"),
    (["--max-image-payload-size", "0"], "for --max-image-payload-size: out of range"),
])
def test_unusable_values_are_refused_before_the_model_resolves(argv, words):
    assert words in refusal(argv)

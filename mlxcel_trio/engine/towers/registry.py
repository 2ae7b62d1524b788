"""Which tower serves a checkpoint: one row per image or audio family.

A row says how config.json names the family and which class builds its
tower ("module:Class", resolved when a checkpoint of the family
loads, so this table imports nothing and every room may read it).  Adding a
family is one file in towers/ (a class with the `Tower` interface of
towers/base.py) and one row here.
"""

from __future__ import annotations

import importlib

import attrs


@attrs.frozen
class ImageFamily:
    name: str                 # VisionInfo.family, the load summary's name
    model_type: str           # config.json's model_type
    vision_type: str | None   # vision_config's model_type (None: any)
    tower: str                # "module:Class" (".name": a module of engine/towers/)
    dynamic: bool = False     # the grid follows the image's size (a token budget applies)
    text_type: str = "llama"  # text_config's model_type when the config leaves it out


@attrs.frozen
class AudioFamily:
    name: str
    model_type: str           # config.json's model_type (with text_config and audio_config)
    tower: str


# First match wins: Pixtral towers inside a llava config come before plain llava.
IMAGE: tuple[ImageFamily, ...] = (
    ImageFamily("pixtral", "llava", "pixtral", ".pixtral:PixtralTower", True, "mistral"),
    ImageFamily("pixtral", "pixtral", "pixtral", ".pixtral:PixtralTower", True, "mistral"),
    ImageFamily("mistral3", "mistral3", "pixtral", ".pixtral:PixtralTower", True, "mistral"),
    ImageFamily("llava", "llava", None, ".llava:LlavaTower"),
)

AUDIO: tuple[AudioFamily, ...] = (
    AudioFamily("gemma3n", "gemma3n", ".gemma3n_audio:Gemma3nAudioTower"),
)


def image_family(config: dict) -> ImageFamily | None:
    """The image family of a config.json (text_config and vision_config
    beside each other), or None (not a VLM served here)."""
    if not (isinstance(config.get("text_config"), dict)
            and isinstance(config.get("vision_config"), dict)):
        return None
    kind, vision = config.get("model_type"), config["vision_config"].get("model_type")
    return next((row for row in IMAGE if row.model_type == kind
                 and row.vision_type in (None, vision)), None)


def audio_family(config: dict) -> AudioFamily | None:
    """The audio family of a chat checkpoint with an audio tower, or None."""
    if not (isinstance(config.get("text_config"), dict)
            and isinstance(config.get("audio_config"), dict)):
        return None
    return next((row for row in AUDIO if row.model_type == config.get("model_type")), None)


def tower_class(row: ImageFamily | AudioFamily):
    """The class that builds the row's tower."""
    module, _, name = row.tower.partition(":")
    return getattr(importlib.import_module(module, __package__), name)

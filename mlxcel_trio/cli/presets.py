"""--models-preset: llama-server's INI presets for router mode.

    [*]                      ; every model, under its own section
    ctx-size = 4096
    [qwen]                   ; a model: by a checkpoint directory, or a cache repo
    model = /models/qwen3-4b-mlx
    alias = q
    temp = 0.6
    [alpha]                  ; a discovered model's name: configuration only
    LLAMA_ARG_N_PARALLEL = 2

A key is an option's spelling without its dashes (any of them: `c`,
`ctx-size`) or its LLAMA_ARG_* variable; a negated spelling
(`no-context-shift`) flips a boolean value.  The preset-only keys are
`load-on-startup` (start the model with the router), `stop-timeout` (read,
no effect: the router's own grace applies) and `dedup-cache-models`.  Any
other key fails startup naming the key and the section, as upstream.  A
model's server runs with the [*] options, then its section's, then the
router's own command line (which wins), as upstream overlays them.
"""

from __future__ import annotations

import configparser
from pathlib import Path

import attrs

from mlxcel_trio.cli.options import OPTIONS
from mlxcel_trio.cli.passthrough import ROUTER_ONLY
from mlxcel_trio.cli.values import is_truthy

PRESET_ONLY = ("load-on-startup", "stop-timeout", "dedup-cache-models")
SOURCE_KEYS = {"model": "model", "hf_repo": "hf_repo"}  # dests that name the checkpoint


class PresetError(ValueError):
    pass


@attrs.frozen
class Preset:
    name: str
    args: tuple[str, ...] = ()              # command-line arguments for its server
    model: str | None = None                # a checkpoint directory
    hf_repo: str | None = None              # a repo id in the Hugging Face cache
    aliases: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    load_on_startup: bool = False


def _keys() -> dict[str, tuple[object, bool]]:
    """key -> (option, negated)."""
    out: dict[str, tuple[object, bool]] = {}
    for opt in OPTIONS:
        if opt.kind == "action":
            continue
        for spelling in opt.spellings:
            out[spelling.lstrip("-")] = (opt, False)
        for spelling in opt.negations:
            out[spelling.lstrip("-")] = (opt, True)
        if opt.env:
            out[opt.env] = (opt, False)
        if getattr(opt, "env_negated", None):
            out[opt.env_negated] = (opt, True)
    return out


def _arguments(opt, negated: bool, value: str) -> tuple[str, ...]:
    long = opt.spellings[-1]
    if opt.kind == "value":
        return (long, *value.split(" ")) if opt.nargs > 1 else (long, value)
    on = is_truthy(value) != negated
    if on:
        return (long,)
    return (opt.negations[-1],) if opt.negations else ()


def load(path: str) -> tuple[Preset, tuple[Preset, ...]]:
    """([*] global, the model sections) of the preset file at `path`."""
    file = Path(path)
    if not file.is_file():
        raise PresetError(f"preset file does not exist: {path}")
    ini = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";", "#"),
                                    comment_prefixes=(";", "#"), default_section="\0none",
                                    strict=False, delimiters=("=",))
    ini.optionxform = str  # keys keep their case: LLAMA_ARG_* names
    try:
        ini.read_string(file.read_text(), source=path)
    except (configparser.Error, OSError, UnicodeDecodeError):
        raise PresetError(f"failed to parse server config file: {path}") from None
    keys = _keys()
    glob, models = Preset("*"), []
    for section in ini.sections():
        args: list[str] = []
        fields: dict = {"name": section}
        for key, value in ini.items(section):
            value = value.strip()
            if key == "load-on-startup":
                fields["load_on_startup"] = is_truthy(value)
                continue
            if key == "version" or key in PRESET_ONLY:  # read, no effect here
                continue
            found = keys.get(key)
            if found is None:
                raise PresetError(f"option '{key}' not recognized in preset '{section}'")
            opt, negated = found
            if opt.dest in SOURCE_KEYS:
                fields[SOURCE_KEYS[opt.dest]] = value
            elif opt.dest == "aliases":
                fields["aliases"] = tuple(a.strip() for a in value.split(",") if a.strip())
            elif opt.dest == "tags":
                fields["tags"] = tuple(t.strip() for t in value.split(",") if t.strip())
            elif opt.dest not in ROUTER_ONLY:  # where a model's server listens is the router's
                args.extend(_arguments(opt, negated, value))
        preset = Preset(args=tuple(args), **fields)
        if section == "*":
            glob = preset
        else:
            models.append(preset)
    return glob, tuple(models)

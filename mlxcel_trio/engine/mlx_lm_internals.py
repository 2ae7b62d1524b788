"""The mlx-lm internals the engine builds on, checked before the server starts.

mlx-lm's public API loads a model and generates; the engine also reads a
few names that are not public: `utils._get_classes` (the model and args
classes of a config, which the VLM and audio hooks wrap and the
distributed planner reads), the remapping tables of `utils` (the module a
config resolves to), and `BatchGenerator._generation_batch` (the running
batch the scheduler swaps for the speculative one and context shift edits).
If an upgrade renamed one, a VLM would fail to load with an AttributeError
and a speculative or context-shifting server would fail at its first
request.  So each is listed here and looked at once, before the model
loads: a mismatch refuses to start with one line naming the installed
version and the supported range (pyproject.toml pins the same range; a unit
test keeps the two equal).  Every use goes through this module's names.
"""

from __future__ import annotations

import importlib
import inspect
from importlib import metadata

SUPPORTED = ">=0.31,<0.40"

# "module:name" -> what it must be (a callable, a mapping), for the names
# taken from mlx-lm modules
HAS: dict[str, str] = {
    "mlx_lm.utils:_get_classes": "callable",
    "mlx_lm.utils:MODEL_REMAPPING": "mapping",
    "mlx_lm.utils:MODEL_ARCHITECTURE_REMAPPING": "mapping",
    "mlx_lm.utils:load_model": "callable",
    "mlx_lm.generate:BatchGenerator": "callable",
    # a window's ring put in token order before a verify step (speculative/rollback.py)
    "mlx_lm.models.cache:BatchRotatingKVCache._temporal_order": "callable",
}

# functions whose code must still name these attributes: the batch generator
# keeps its running batch at `_generation_batch`
NAMED_IN: dict[str, tuple[str, ...]] = {
    "mlx_lm.generate:BatchGenerator.__init__": ("_generation_batch",),
}


class MlxLmUnsupported(Exception):
    """The installed mlx-lm lacks an internal the engine needs; str() is the
    one-line reason."""


def installed_version() -> str:
    try:
        return metadata.version("mlx-lm")
    except metadata.PackageNotFoundError:
        return "(not installed)"


def _resolve(spec: str):
    module, _, name = spec.partition(":")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def missing() -> list[str]:
    """Every internal that is gone or changed shape, one entry each."""
    gone = []
    for spec, kind in HAS.items():
        try:
            obj = _resolve(spec)
        except (ImportError, AttributeError):
            gone.append(spec)
            continue
        shape_ok = callable(obj) if kind == "callable" else hasattr(obj, "get")
        if not shape_ok:
            gone.append(f"{spec} (not a {kind})")
    for spec, names in NAMED_IN.items():
        try:
            code = inspect.getsource(_resolve(spec))
        except (ImportError, AttributeError, OSError, TypeError):
            gone.append(spec)
            continue
        gone.extend(f"{spec} no longer sets {n}" for n in names if n not in code)
    return gone


def check() -> None:
    """Raise MlxLmUnsupported unless every internal the engine uses is there."""
    gone = missing()
    if gone:
        raise MlxLmUnsupported(
            f"mlx-lm {installed_version()} lacks what mlxcel-trio builds on "
            f"({'; '.join(gone)}); install mlx-lm{SUPPORTED}")


def get_classes(config: dict):
    """mlx-lm's (model class, args class) for a config (utils._get_classes)."""
    from mlx_lm.utils import _get_classes

    return _get_classes(config)


def resolved_type(config: dict) -> str:
    """mlx-lm's own resolution of the module name (utils._get_classes)."""
    from mlx_lm.utils import MODEL_ARCHITECTURE_REMAPPING, MODEL_REMAPPING

    model_type = str(config.get("model_type"))
    architectures = config.get("architectures") or ()
    if isinstance(architectures, str):
        architectures = (architectures,)
    for architecture in architectures:
        remapped = MODEL_ARCHITECTURE_REMAPPING.get((model_type, architecture))
        if remapped is not None:
            return remapped
    return MODEL_REMAPPING.get(model_type, model_type)

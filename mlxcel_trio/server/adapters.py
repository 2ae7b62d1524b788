"""The LoRA adapters the server loaded, and their global scales.

Adapters are numbered in command-line order (--lora and --lora-scaled
together, as upstream numbers them).  The global scales start at each
adapter's command-line scale (0 with --lora-init-without-apply) and change
with POST /lora-adapters.  A request resolves its own vector when it is
parsed: its `lora` field if it has one, else a copy of the global scales
then in force; that vector travels with its job, so a later POST never
changes a generation already running (the engine carries a scale vector
per sequence: engine/lora.py).

Both lists resolve by upstream's rule: the listed ids take their scales,
every other adapter drops to 0.  Where upstream silently ignores a bad entry
(an unknown id, a scale that is not a number) this server refuses the
request: an adapter the client believes applied must be applied.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from .http.errors import ApiError

LORA_SHAPE = "Error: 'lora' must be an array of objects with 'id' and 'scale' fields"
BODY_SHAPE = "Request body must be an array"
BODY_ENTRIES = "Request body must be an array of objects with 'id' and 'scale' fields"

Scales = tuple[float, ...]


@attrs.define(eq=False)
class AdapterTable:
    paths: tuple[str, ...] = ()
    scales: Scales = ()

    @classmethod
    def from_config(cls, config: Any) -> AdapterTable:
        adapters = tuple(getattr(config, "adapters", ()))
        start = 0.0 if getattr(config, "lora_init_without_apply", False) else None
        return cls(tuple(p for p, _ in adapters),
                   tuple(s if start is None else start for _, s in adapters))

    def entries(self) -> list[dict]:
        """GET /lora-adapters: upstream's entry shape (a GGUF adapter's task
        name and prompt prefix come from its metadata; MLX adapters have none)."""
        return [{"id": i, "path": path, "scale": scale, "task_name": "", "prompt_prefix": ""}
                for i, (path, scale) in enumerate(zip(self.paths, self.scales))]

    def resolve(self, entries: Any, shape_error: str) -> Scales:
        """A list of {id, scale}: listed adapters take their scale, the rest 0.
        `shape_error` is the message for an entry that is not {id, scale}."""
        out = [0.0] * len(self.paths)
        for entry in entries:
            if not isinstance(entry, dict):
                raise ApiError(shape_error)
            adapter_id, scale = entry.get("id"), entry.get("scale")
            if not _is_int(adapter_id) or not _is_number(scale):
                raise ApiError(shape_error)
            if not 0 <= adapter_id < len(out):
                raise ApiError(f"invalid adapter id {adapter_id}: this server has "
                               f"{len(out)} LoRA adapter(s)"
                               + (f", ids 0 to {len(out) - 1}" if out else ""))
            out[adapter_id] = float(scale)
        return tuple(out)

    def request_scales(self, body: dict) -> Scales:
        """The vector a completion request runs with."""
        raw = body.get("lora")
        if raw is None:  # absent (null counts as absent, as for every field)
            return self.scales
        if not isinstance(raw, list):
            raise ApiError(f"Field 'lora': {LORA_SHAPE}")
        try:
            return self.resolve(raw, LORA_SHAPE)
        except ApiError as exc:
            raise ApiError(f"Field 'lora': {exc.message}") from None

    def apply(self, body: Any) -> None:
        """POST /lora-adapters: the new global scales."""
        if not isinstance(body, list):
            raise ApiError(BODY_SHAPE)
        self.scales = self.resolve(body, BODY_ENTRIES)


def report(scales: Scales) -> list[dict]:
    """generation_settings.lora: the vector in force, as {id, scale} pairs."""
    return [{"id": i, "scale": s} for i, s in enumerate(scales)]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))

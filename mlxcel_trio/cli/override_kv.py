"""--override-kv KEY=TYPE:VALUE,...: upstream's GGUF metadata overrides,
mapped onto an MLX checkpoint where the key has an analogue.

Upstream rewrites the model's GGUF metadata before it loads; an MLX
checkpoint keeps the same facts in config.json and the tokenizer files.
`KEYS` is the one table of keys honoured, each with the type upstream's
loader reads it as and where it lands: the tokenizer's BOS / EOS handling,
the training context, and the RoPE settings (the same fields the --rope-*
options set, which win when both are given, as upstream's command-line
RoPE values beat the model's metadata).  ARCH is any architecture name
(upstream's keys carry the GGUF one, e.g. `llama.context_length`); the
checkpoint's model_type is not known before it loads, so any name is taken.
Every other key is refused at startup, naming it and the honoured keys.
"""

from __future__ import annotations

import attrs

from mlxcel_trio.cli.values import BadValue

TYPES = ("int", "float", "bool", "str")
SCALING_TYPES = ("none", "linear", "yarn")


@attrs.frozen
class Key:
    """One honoured key: upstream's type for it and the dest it sets (a
    ServerConfig field, or "rope.x" for RopeOverrides)."""

    suffix: str        # the key after ARCH. (or the whole key when `arch` is False)
    type: str
    dest: str
    arch: bool = True  # the key starts with an architecture name


KEYS: tuple[Key, ...] = (
    Key("tokenizer.ggml.add_bos_token", "bool", "add_bos", arch=False),
    Key("tokenizer.ggml.add_eos_token", "bool", "add_eos", arch=False),
    Key("context_length", "int", "n_ctx_train"),
    Key("rope.freq_base", "float", "rope.freq_base"),
    Key("rope.scaling.factor", "float", "rope.scale"),
    Key("rope.scaling.type", "str", "rope.scaling"),
    Key("rope.scaling.original_context_length", "int", "rope.yarn_orig_ctx"),
)

HONOURED = ", ".join(k.suffix if not k.arch else f"ARCH.{k.suffix}" for k in KEYS)


def _key(name: str) -> Key | None:
    for k in KEYS:
        if not k.arch and name == k.suffix:
            return k
        if k.arch:
            arch, dot, rest = name.partition(".")
            if dot and arch and "." not in arch and rest == k.suffix \
                    and not arch.startswith("tokenizer") and arch != "general":
                return k
    return None


def _typed(item: str, kind: str, text: str, key: Key) -> object:
    """The value as upstream's parser reads it (its messages for a bad
    boolean), then checked where our target is stricter."""
    if kind == "bool":
        if text not in ("true", "false"):
            raise BadValue(f"invalid boolean value for KV override '{item}'")
        return text == "true"
    if kind == "int":
        try:
            value: object = int(text)
        except ValueError:
            raise BadValue(f"'{item}': {text!r} is not an integer") from None
        if value <= 0:  # type: ignore[operator]
            raise BadValue(f"'{item}': {key.suffix} must be above 0")
        return value
    if kind == "float":
        try:
            value = float(text)
        except ValueError:
            raise BadValue(f"'{item}': {text!r} is not a number") from None
        if not value > 0 or value == float("inf"):  # type: ignore[operator]
            raise BadValue(f"'{item}': {key.suffix} must be a finite number above 0")
        return value
    if len(text) > 127:
        raise BadValue(f"malformed KV override '{item}', value cannot exceed 127 chars")
    if key.dest == "rope.scaling" and text not in SCALING_TYPES:
        raise BadValue(f"'{item}': rope.scaling.type is one of {', '.join(SCALING_TYPES)}")
    return text


@attrs.frozen
class KvOverrideList:
    """Comma-separated KEY=TYPE:VALUE items; parses to ((dest, value), ...)
    in the order given (a later item for the same key wins)."""

    domain: str = f"comma-separated KEY=TYPE:VALUE items with a key among: {HONOURED}"

    def parse(self, text: str) -> tuple[tuple[str, object], ...]:
        out = []
        for item in (i for i in text.split(",") if i):
            name, eq, rest = item.partition("=")
            if not eq or not name or len(name) >= 128:
                raise BadValue(f"malformed KV override '{item}'")
            kind, colon, value = rest.partition(":")
            if not colon or kind not in TYPES:
                raise BadValue(f"invalid type for KV override '{item}'")
            key = _key(name)
            if key is None:
                raise BadValue(f"'{name}' has no analogue in an MLX checkpoint (its settings "
                               "are config.json's and the tokenizer files'; set them there)")
            if kind != key.type:
                raise BadValue(f"'{item}': {name} is read as {key.type}, not {kind}")
            out.append((key.dest, _typed(item, kind, value, key)))
        if not out:
            raise BadValue("no override given")
        return tuple(out)


def resolved(occurrences: tuple[tuple[tuple[str, object], ...], ...] | None) -> dict[str, object]:
    """Every occurrence's items, later ones winning: {dest: value}."""
    return {dest: value for items in occurrences or () for dest, value in items}

"""The sentence-transformers files around an encoder checkpoint.

    modules.json              the pipeline, in order: Transformer (its path
                              is "" today, "0_Transformer" in old saves),
                              Pooling, optional Dense layers, optional Normalize
    1_Pooling/config.json     pooling_mode_* flags -> the default pooling
    2_Dense/config.json       in_features, out_features, bias,
                              activation_function (a torch class path)
    2_Dense/model.safetensors linear.weight [out, in], linear.bias [out]

Pooling names are llama-server's (`mean`, `cls`, `last`); the flags are read
in the order llama.cpp's converter reads them (mean, then cls, then last).
A mode llama-server has no name for (max, mean_sqrt_len_tokens,
weightedmean) is reported, not guessed: `pooling_mode` returns None and the
loader falls back to the architecture's default with a note.

Sentence-transformers applies Dense only to the pooled sentence vector
(token embeddings pass through unchanged), so `project` is for pooled
vectors.  A Dense stored only as pytorch_model.bin cannot be read without
torch and is refused by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
from mlx import nn

TRANSFORMER = "sentence_transformers.models.Transformer"
POOLING = "sentence_transformers.models.Pooling"
DENSE = "sentence_transformers.models.Dense"
NORMALIZE = "sentence_transformers.models.Normalize"

# pooling_mode_* flag -> llama-server's name, in llama.cpp's converter order.
_POOLING_FLAGS = (("pooling_mode_mean_tokens", "mean"),
                  ("pooling_mode_cls_token", "cls"),
                  ("pooling_mode_lasttoken", "last"))
_UNNAMED_FLAGS = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                  "pooling_mode_weightedmean_tokens")

_ACTIVATIONS = {
    "torch.nn.modules.activation.Tanh": mx.tanh,
    "torch.nn.modules.linear.Identity": lambda x: x,
    "torch.nn.modules.activation.ReLU": nn.relu,
    "torch.nn.modules.activation.GELU": nn.gelu,
    "torch.nn.modules.activation.Sigmoid": mx.sigmoid,
    "torch.nn.modules.activation.SiLU": nn.silu,
}


@dataclass(frozen=True)
class Pipeline:
    """What modules.json says, with paths resolved against the checkpoint."""
    transformer_dir: Path
    pooling_dir: Path | None
    dense_dirs: tuple[Path, ...]
    normalize: bool


def read_pipeline(root: Path) -> Pipeline | None:
    """None when the checkpoint has no modules.json."""
    path = root / "modules.json"
    if not path.is_file():
        return None
    modules = json.loads(path.read_text(encoding="utf-8"))
    transformer, pooling, dense, normalize = root, None, [], False
    for mod in sorted(modules, key=lambda m: int(m.get("idx", 0))):
        kind = mod.get("type", "")
        if kind == TRANSFORMER:
            transformer = root / mod.get("path", "")
        elif kind == POOLING and pooling is None:
            pooling = root / mod["path"]
        elif kind == DENSE:
            dense.append(root / mod["path"])
        elif kind == NORMALIZE:
            normalize = True
    return Pipeline(transformer, pooling, tuple(dense), normalize)


def pooling_mode(pooling_dir: Path) -> tuple[str | None, str]:
    """(llama-server pooling name or None, the mode as the file states it)."""
    cfg = json.loads((pooling_dir / "config.json").read_text(encoding="utf-8"))
    for flag, name in _POOLING_FLAGS:
        if cfg.get(flag):
            return name, flag.removeprefix("pooling_mode_")
    stated = [f.removeprefix("pooling_mode_") for f in _UNNAMED_FLAGS if cfg.get(f)]
    return None, "+".join(stated) or "none set"


class DenseLayer(nn.Module):
    """sentence_transformers.models.Dense: activation(linear(x))."""

    def __init__(self, in_features: int, out_features: int, bias: bool, activation: str):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"unsupported Dense activation {activation!r}; supported: "
                             f"{', '.join(sorted(_ACTIVATIONS))}")
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.activation = activation
        self._act = _ACTIVATIONS[activation]

    def __call__(self, x: mx.array) -> mx.array:
        return self._act(self.linear(x))


def load_dense(directory: Path, dtype) -> DenseLayer:
    cfg = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    layer = DenseLayer(int(cfg["in_features"]), int(cfg["out_features"]),
                       bool(cfg.get("bias", True)),
                       cfg.get("activation_function", "torch.nn.modules.activation.Tanh"))
    weights_path = directory / "model.safetensors"
    if not weights_path.is_file():
        raise FileNotFoundError(f"{directory}: no model.safetensors (a pytorch_model.bin "
                                "Dense layer needs torch, which this server does not use)")
    weights = {k: v.astype(dtype) for k, v in mx.load(str(weights_path)).items()}
    layer.load_weights(list(weights.items()), strict=True)
    return layer

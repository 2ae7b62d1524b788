"""Decoder embedders through mlx-lm: a causal checkpoint's final (normed)
hidden states, behind the encoders' interface.

    model, info = load_decoder(path)
    hidden = model(ids, mask)     # [B, L] -> [B, L, H]: mlx-lm's `model.model(ids)`
    vec = model.project(pooled)   # the sentence-transformers Dense layers, if any

Right padding is exact here without a mask: causal attention lets a real
token see only the tokens before it, all real, and positions start at 0 in
every row, so each row equals its single-input result.  The pooling is the
checkpoint's 1_Pooling/config.json (Qwen3-Embedding: last token), else
"none", which is what llama-server gives a model whose GGUF names no pooling.
There is no classifier head: such a checkpoint cannot rerank.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from . import sentence
from .loader import EncoderInfo


class DecoderEmbedder(nn.Module):
    def __init__(self, lm: nn.Module, dense: list) -> None:
        super().__init__()
        self.lm = lm
        self.st_dense = dense

    def __call__(self, input_ids: mx.array, attention_mask: mx.array | None = None,
                 token_type_ids: mx.array | None = None) -> mx.array:
        return self.lm.model(input_ids)

    def project(self, pooled: mx.array) -> mx.array:
        for layer in self.st_dense:
            pooled = layer(pooled)
        return pooled


def load_decoder(path: str | Path) -> tuple[DecoderEmbedder, EncoderInfo]:
    from ..rope import load as load_lm
    from ...config import RopeOverrides

    root = Path(path)
    lm, config = load_lm(root, RopeOverrides())
    if not hasattr(lm, "model"):
        raise ValueError(f"{root}: mlx-lm's {type(lm).__name__} exposes no hidden states")
    pipeline = sentence.read_pipeline(root)
    dense = [sentence.load_dense(d, mx.float32) for d in (pipeline.dense_dirs if pipeline else ())]
    model = DecoderEmbedder(lm, dense)
    mx.eval(model.parameters())
    pooling, source, notes = "none", "architecture default", ()
    if pipeline is not None and pipeline.pooling_dir is not None:
        name, stated = sentence.pooling_mode(pipeline.pooling_dir)
        if name is not None:
            pooling, source = name, "1_Pooling/config.json"
        else:
            notes = (f"1_Pooling asks for pooling {stated!r}, which llama-server cannot name; "
                     "defaulting to 'none'",)
    hidden = int(config.get("hidden_size") or json.loads(
        (root / "config.json").read_text()).get("hidden_size", 0))
    dtype = next((str(p.dtype).removeprefix("mlx.core.") for _, p in tree_flatten(lm.parameters())
                  if not str(p.dtype).endswith("uint32")), "unknown")
    architectures = config.get("architectures") or [config.get("model_type", "decoder")]
    info = EncoderInfo(
        architecture=str(architectures[0]), model_type=str(config.get("model_type")),
        hidden_size=hidden,
        max_positions=int(config.get("max_position_embeddings") or 32768),
        vocab_size=int(config.get("vocab_size", 0)), pad_token_id=0,
        default_pooling=pooling, pooling_source=source, num_labels=None, labels=(),
        dense_layers=len(dense),
        embedding_size=dense[-1].linear.weight.shape[0] if dense else hidden,
        normalize=bool(pipeline and pipeline.normalize), dtype=dtype, notes=notes)
    return model, info

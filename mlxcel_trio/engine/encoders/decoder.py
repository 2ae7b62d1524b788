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
A Qwen3-Reranker-style checkpoint (upstream's own test, `is_qwen3_reranker`)
reranks instead: `DecoderReranker.classify` is the softmax of its "yes" and
"no" logits at the last token of upstream's rerank prompt
(`QWEN3_RERANK_TEMPLATE`, which the server fills in), as upstream's GGUF
conversion computes it.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
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


# -- Qwen3-Reranker-style decoder rerankers ------------------------------------------------

# upstream's "rerank" prompt for these (its GGUF converter writes it into the
# model; {query} and {document} are replaced, then tokenized without BOS)
QWEN3_RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the "
    "Query and the Instruct provided. Note that the answer can only be \"yes\" or "
    "\"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: Given a web search query, retrieve "
    "relevant passages that answer the query\n<Query>: {query}\n<Document>: "
    "{document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")


def is_qwen3_reranker(path: str | Path) -> bool:
    """Upstream's test (its converter): a README titled Qwen3-Reranker, a
    name that says so, or a ...SequenceClassification architecture."""
    root = Path(path)
    readme = root / "README.md"
    text = readme.read_text(encoding="utf-8", errors="replace").lower() if readme.is_file() else ""
    if "# qwen3-reranker" in text or "# qwen3-vl-reranker" in text:
        return True
    try:
        config = json.loads((root / "config.json").read_text())
    except (OSError, ValueError):
        return False
    if str(config.get("model_type")) not in ("qwen3", "qwen3_vl"):
        return False
    arch = str((config.get("architectures") or [""])[0])
    hints = [root.name, str(config.get("_name_or_path", "")), arch]
    if any("qwen3-reranker" in h.lower() or "qwen3-vl-reranker" in h.lower() for h in hints):
        return True
    return "sequenceclassification" in arch.lower()


class DecoderReranker(DecoderEmbedder):
    """classify: the softmax of the "yes" and "no" logits at each row's last
    real token, [B, 2] with yes first (upstream's score is the yes share)."""

    rerank_template = QWEN3_RERANK_TEMPLATE

    def __init__(self, lm: nn.Module, yes: int, no: int) -> None:
        super().__init__(lm, [])
        self.label_ids = (yes, no)

    def classify(self, input_ids: mx.array, attention_mask: mx.array | None = None,
                 token_type_ids: mx.array | None = None) -> mx.array:
        hidden = self.lm.model(input_ids)
        if attention_mask is None:
            last = hidden[:, -1, :]
        else:
            idx = (attention_mask.sum(axis=1) - 1).astype(mx.int32)
            last = mx.take_along_axis(hidden, idx[:, None, None], axis=1)[:, 0, :]
        head = (self.lm.lm_head if hasattr(self.lm, "lm_head")
                else self.lm.model.embed_tokens.as_linear)  # tied embeddings
        logits = head(last)[:, list(self.label_ids)]
        return mx.softmax(logits.astype(mx.float32), axis=-1)


def load_decoder_reranker(path: str | Path) -> tuple[DecoderReranker, EncoderInfo]:
    from tokenizers import Tokenizer

    root = Path(path)
    tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    yes, no = tok.token_to_id("yes"), tok.token_to_id("no")
    if yes is None or no is None:
        raise ValueError(f"{root}: a Qwen3-Reranker-style model needs \"yes\" and \"no\" tokens")
    body, info = load_decoder(root)
    if max(yes, no) >= info.vocab_size:
        raise ValueError(f"{root}: the \"yes\" / \"no\" tokens lie past the model's "
                         f"{info.vocab_size} output rows")
    model = DecoderReranker(body.lm, yes, no)
    return model, attrs.evolve(info, default_pooling="rank", pooling_source="yes/no logits",
                               num_labels=2, labels=("yes", "no"))

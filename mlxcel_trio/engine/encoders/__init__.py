"""Encoder models for embeddings and reranking, written with MLX (mlx-lm
has no encoder architectures): one small file per architecture, as mlx-lm
does, and a loader for the Hugging Face / sentence-transformers layouts.

    model, info = load(path)          # loader.py
    hidden = model(ids, mask)         # [B, L] -> [B, L, H], float32 on a CPU
    vec = model.project(pooled)       # 2_Dense ... layers on pooled [B, H]
    logits = model.classify(ids, mask)  # heads only: [B, num_labels]

Inputs of different lengths are padded on the RIGHT, with attention_mask 1
on real tokens and 0 on padding; each row then equals its single-input
result.  Pooling itself is the caller's (info.default_pooling names it).
decoder.py puts a causal checkpoint (mlx-lm) behind the same interface.
Nothing here imports trio: this runs on the engine thread.
"""

from .bert import BertForSequenceClassification, BertModel
from .loader import POOLINGS, EncoderInfo, EncoderLoadError, load
from .xlm_roberta import XLMRobertaForSequenceClassification, XLMRobertaModel

__all__ = [
           "POOLINGS",
           "BertForSequenceClassification",
           "BertModel",
           "EncoderInfo",
           "EncoderLoadError",
           "XLMRobertaForSequenceClassification",
           "XLMRobertaModel",
           "load",
]

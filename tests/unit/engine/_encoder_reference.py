"""A literal NumPy (float64) reference for the encoder fixtures' architectures.

Written from Hugging Face's modeling_bert / modeling_roberta and
sentence-transformers' Dense, independently of mlxcel_trio: it reads the
checkpoint's files itself (safetensors.numpy, config.json, 2_Dense), runs
ONE unpadded input at a time (so no mask at all), and loops over heads.
Slow and plain on purpose.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

_erf = np.vectorize(math.erf)


class Reference:
    def __init__(self, root: Path):
        self.cfg = json.loads((root / "config.json").read_text())
        self.roberta = self.cfg["model_type"] in ("roberta", "xlm-roberta")
        raw = {}
        for f in sorted(root.glob("*.safetensors")):
            raw.update(load_file(str(f)))
        self.w = {}
        for k, v in raw.items():
            for p in ("bert.", "roberta.", "model."):
                k = k.removeprefix(p)
            self.w[k] = v.astype(np.float64)
        dense = root / "2_Dense"
        self.dense = None
        if dense.is_dir():
            d = load_file(str(dense / "model.safetensors"))
            self.dense = (d["linear.weight"].astype(np.float64), d["linear.bias"].astype(np.float64))

    def _lin(self, name, x):
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def _ln(self, name, x):
        eps = self.cfg["layer_norm_eps"]
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * self.w[name + ".weight"] + self.w[name + ".bias"]

    def hidden(self, ids: list[int], type_ids: list[int] | None = None) -> np.ndarray:
        """[L, H] last hidden states of one input."""
        L, cfg = len(ids), self.cfg
        if self.roberta:  # padding_idx + 1 onwards (the input holds no padding)
            pos = np.arange(L) + cfg["pad_token_id"] + 1
        else:
            pos = np.arange(L)
        types = np.zeros(L, int) if type_ids is None else np.asarray(type_ids)
        x = (self.w["embeddings.word_embeddings.weight"][ids]
             + self.w["embeddings.position_embeddings.weight"][pos]
             + self.w["embeddings.token_type_embeddings.weight"][types])
        x = self._ln("embeddings.LayerNorm", x)
        nh = cfg["num_attention_heads"]
        hd = cfg["hidden_size"] // nh
        for i in range(cfg["num_hidden_layers"]):
            p = f"encoder.layer.{i}."
            q = self._lin(p + "attention.self.query", x)
            k = self._lin(p + "attention.self.key", x)
            v = self._lin(p + "attention.self.value", x)
            ctx = np.zeros_like(x)
            for h in range(nh):
                s = slice(h * hd, (h + 1) * hd)
                scores = q[:, s] @ k[:, s].T / math.sqrt(hd)
                scores = np.exp(scores - scores.max(-1, keepdims=True))
                ctx[:, s] = (scores / scores.sum(-1, keepdims=True)) @ v[:, s]
            x = self._ln(p + "attention.output.LayerNorm", self._lin(p + "attention.output.dense", ctx) + x)
            inner = self._lin(p + "intermediate.dense", x)
            inner = 0.5 * inner * (1.0 + _erf(inner / math.sqrt(2.0)))
            x = self._ln(p + "output.LayerNorm", self._lin(p + "output.dense", inner) + x)
        return x

    def logits(self, ids: list[int], type_ids: list[int] | None = None) -> np.ndarray:
        first = self.hidden(ids, type_ids)[0]
        if self.roberta:
            return self._lin("classifier.out_proj", np.tanh(self._lin("classifier.dense", first)))
        return self._lin("classifier", np.tanh(self._lin("pooler.dense", first)))

    def dense_head(self, pooled: np.ndarray) -> np.ndarray:
        w, b = self.dense
        return np.tanh(pooled @ w.T + b)

"""A Qwen3-Reranker-style checkpoint built from the tiny qwen3 fixture, for
the decoder reranker's tests (unit and e2e)."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx


def qwen3_reranker(tiny: Path, root: Path) -> Path:
    """The tiny qwen3 fixture named as a Qwen3-Reranker, with "yes" and "no"
    tokens (two more rows in its embedding and head)."""
    import shutil

    out = root / "tiny-qwen3-reranker"
    shutil.copytree(tiny, out)
    tj = json.loads((out / "tokenizer.json").read_text())
    n = json.loads((out / "config.json").read_text())["vocab_size"]
    base = tj["added_tokens"][0]
    tj["added_tokens"] += [dict(base, id=n, content="yes", special=False),
                           dict(base, id=n + 1, content="no", special=False)]
    (out / "tokenizer.json").write_text(json.dumps(tj))
    weights = mx.load(str(out / "model.safetensors"))
    for k, w in weights.items():
        if w.ndim == 2 and w.shape[0] == n:
            weights[k] = mx.concatenate([w, w[:2] * 0.5 + 0.01])
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "vocab_size": n + 2}))
    return out

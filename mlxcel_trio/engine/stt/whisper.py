"""Whisper in MLX, weight-compatible with mlx-community's Whisper layout.

config.json carries the dimensions (n_mels, n_audio_ctx, n_audio_state,
n_audio_head, n_audio_layer, n_vocab, n_text_ctx, n_text_state, n_text_head,
n_text_layer) and model_type "whisper"; the weights are `weights.safetensors`
(or `model.safetensors`) with the keys the reference MLX port writes:
encoder.conv1/conv2 (channels-last), encoder.blocks.N.{attn,attn_ln,mlp1,
mlp2,mlp_ln}, encoder.ln_post, decoder.token_embedding,
decoder.positional_embedding, decoder.blocks.N.{attn,cross_attn,...},
decoder.ln.  The encoder's sinusoidal positions are computed, not stored.
A "quantization" block ({group_size, bits}) quantizes the Linear and
Embedding layers that carry scales, as mlx-community's quantized exports do.
transformers' layout is read too: a config with d_model / encoder_layers /
num_mel_bins, and weights named model.encoder.layers.N.self_attn.q_proj and
so on (conv kernels transposed to channels-last, the encoder's stored
positions and the tied proj_out dropped).

The decoder keeps a per-layer cache: self-attention keys/values grow by one
row per token; cross-attention keys/values are computed from the audio
features once per window.  Engine thread only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import attrs
import mlx.core as mx
import mlx.nn as nn

DIMS = ("n_mels", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer",
        "n_vocab", "n_text_ctx", "n_text_state", "n_text_head", "n_text_layer")
WEIGHT_FILES = ("weights.safetensors", "model.safetensors")
_HF_DIMS = {"n_mels": "num_mel_bins", "n_audio_ctx": "max_source_positions",
            "n_audio_state": "d_model", "n_audio_head": "encoder_attention_heads",
            "n_audio_layer": "encoder_layers", "n_vocab": "vocab_size",
            "n_text_ctx": "max_target_positions", "n_text_head": "decoder_attention_heads",
            "n_text_layer": "decoder_layers"}
# transformers' weight names -> the MLX port's, applied in order
_HF_NAMES = (("model.", ""), ("encoder.layers.", "encoder.blocks."),
             ("decoder.layers.", "decoder.blocks."), ("encoder.layer_norm.", "encoder.ln_post."),
             ("decoder.layer_norm.", "decoder.ln."), (".self_attn_layer_norm.", ".attn_ln."),
             (".encoder_attn_layer_norm.", ".cross_attn_ln."),
             (".final_layer_norm.", ".mlp_ln."), (".fc1.", ".mlp1."), (".fc2.", ".mlp2."),
             (".self_attn.", ".attn."), (".encoder_attn.", ".cross_attn."),
             (".q_proj.", ".query."), (".k_proj.", ".key."), (".v_proj.", ".value."),
             (".out_proj.", ".out."), ("decoder.embed_tokens.", "decoder.token_embedding."),
             ("decoder.embed_positions.weight", "decoder.positional_embedding"))


@attrs.frozen
class Dims:
    n_mels: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_vocab: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int

    @classmethod
    def from_config(cls, config: dict) -> "Dims":
        if "d_model" in config:   # transformers' WhisperConfig
            config = {**config, **{ours: config.get(theirs) for ours, theirs in _HF_DIMS.items()}}
            config["n_text_state"] = config["n_audio_state"]
        missing = [k for k in DIMS if not isinstance(config.get(k), int) or config[k] <= 0]
        if missing:
            raise ValueError(f"config.json lacks the Whisper dimension(s) {', '.join(missing)}")
        return cls(**{k: int(config[k]) for k in DIMS})


def sinusoids(length: int, channels: int) -> mx.array:
    increment = math.log(10000) / (channels // 2 - 1)
    inv = mx.exp(-increment * mx.arange(channels // 2))
    t = mx.arange(length)[:, None] * inv[None, :]
    return mx.concatenate([mx.sin(t), mx.cos(t)], axis=1)


class Attention(nn.Module):
    def __init__(self, n_state: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(n_state, n_state)
        self.key = nn.Linear(n_state, n_state, bias=False)
        self.value = nn.Linear(n_state, n_state)
        self.out = nn.Linear(n_state, n_state)

    def _heads(self, x: mx.array) -> mx.array:
        B, L, _ = x.shape
        return x.reshape(B, L, self.n_head, -1).transpose(0, 2, 1, 3)

    def __call__(self, x, kv=None, mask=None, *, source=None, append=True):
        """Self-attention (source None: keys/values from x, appended to `kv`)
        or cross-attention (keys/values from `source`, or reused from `kv`)."""
        q = self._heads(self.query(x))
        if source is None:
            k, v = self._heads(self.key(x)), self._heads(self.value(x))
            if kv is not None:
                k, v = mx.concatenate([kv[0], k], axis=2), mx.concatenate([kv[1], v], axis=2)
        elif kv is None:
            k, v = self._heads(self.key(source)), self._heads(self.value(source))
        else:
            k, v = kv
        scale = q.shape[-1] ** -0.5
        o = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
        B, _, L, _ = o.shape
        return self.out(o.transpose(0, 2, 1, 3).reshape(B, L, -1)), (k, v)


class Block(nn.Module):
    def __init__(self, n_state: int, n_head: int, cross: bool = False) -> None:
        super().__init__()
        self.attn = Attention(n_state, n_head)
        self.attn_ln = nn.LayerNorm(n_state)
        self.cross_attn = Attention(n_state, n_head) if cross else None
        self.cross_attn_ln = nn.LayerNorm(n_state) if cross else None
        self.mlp1 = nn.Linear(n_state, 4 * n_state)
        self.mlp2 = nn.Linear(4 * n_state, n_state)
        self.mlp_ln = nn.LayerNorm(n_state)

    def __call__(self, x, xa=None, mask=None, cache=None):
        self_kv, cross_kv = cache if cache is not None else (None, None)
        y, self_kv = self.attn(self.attn_ln(x), self_kv, mask)
        x = x + y
        if self.cross_attn is not None:
            y, cross_kv = self.cross_attn(self.cross_attn_ln(x), cross_kv, source=xa)
            x = x + y
        x = x + self.mlp2(nn.gelu(self.mlp1(self.mlp_ln(x))))
        return x, (self_kv, cross_kv)


class AudioEncoder(nn.Module):
    def __init__(self, d: Dims) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(d.n_mels, d.n_audio_state, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d.n_audio_state, d.n_audio_state, kernel_size=3, stride=2,
                               padding=1)
        self._positions = sinusoids(d.n_audio_ctx, d.n_audio_state)
        self.blocks = [Block(d.n_audio_state, d.n_audio_head) for _ in range(d.n_audio_layer)]
        self.ln_post = nn.LayerNorm(d.n_audio_state)

    def __call__(self, mel: mx.array) -> mx.array:
        """mel [B, 2 * n_audio_ctx, n_mels] -> features [B, n_audio_ctx, state]."""
        x = nn.gelu(self.conv1(mel))
        x = nn.gelu(self.conv2(x))
        x = x + self._positions.astype(x.dtype)
        for block in self.blocks:
            x, _ = block(x)
        return self.ln_post(x)


class TextDecoder(nn.Module):
    def __init__(self, d: Dims) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(d.n_vocab, d.n_text_state)
        self.positional_embedding = mx.zeros((d.n_text_ctx, d.n_text_state))
        self.blocks = [Block(d.n_text_state, d.n_text_head, cross=True)
                       for _ in range(d.n_text_layer)]
        self.ln = nn.LayerNorm(d.n_text_state)

    def __call__(self, tokens: mx.array, xa: mx.array, cache: list | None):
        """Logits [B, L, n_vocab] for `tokens` [B, L] after the cached ones,
        and the updated cache (one (self_kv, cross_kv) per layer)."""
        offset = cache[0][0][0].shape[2] if cache else 0
        L = tokens.shape[-1]
        x = self.token_embedding(tokens) + self.positional_embedding[offset:offset + L]
        mask = "causal" if L > 1 else None
        cache = cache or [None] * len(self.blocks)
        for i, block in enumerate(self.blocks):
            x, cache[i] = block(x, xa, mask, cache[i])
        return self.token_embedding.as_linear(self.ln(x)), cache


class Whisper(nn.Module):
    def __init__(self, dims: Dims) -> None:
        super().__init__()
        self.dims = dims
        self.encoder = AudioEncoder(dims)
        self.decoder = TextDecoder(dims)


def _from_transformers(weights: dict) -> dict:
    out = {}
    for key, value in weights.items():
        if key == "proj_out.weight" or key.endswith("encoder.embed_positions.weight"):
            continue   # tied to the token embedding / computed
        for theirs, ours in _HF_NAMES:
            key = key.replace(theirs, ours)
        if key.startswith("encoder.conv") and key.endswith(".weight") and value.ndim == 3:
            value = value.transpose(0, 2, 1)   # (out, in, k) -> (out, k, in)
        out[key] = value
    return out


def weight_file(path: Path) -> Path | None:
    return next((path / name for name in WEIGHT_FILES if (path / name).is_file()), None)


def load(path: Path) -> tuple[Whisper, dict]:
    """The model and its config.json; raises ValueError naming what is wrong."""
    config = json.loads((path / "config.json").read_text())
    dims = Dims.from_config(config)
    wf = weight_file(path)
    if wf is None:
        raise ValueError(f"no {' or '.join(WEIGHT_FILES)} in the checkpoint")
    weights = mx.load(str(wf))
    model = Whisper(dims)
    quant = config.get("quantization")
    if isinstance(quant, dict):
        nn.quantize(model, group_size=int(quant.get("group_size", 64)),
                    bits=int(quant.get("bits", 4)),
                    class_predicate=lambda p, m: isinstance(m, (nn.Linear, nn.Embedding))
                    and f"{p}.scales" in weights)
    if any(k.startswith("model.") for k in weights):
        weights = _from_transformers(weights)
    # not parameters of the port: computed positions, the reference's alignment heads
    weights = {k: v for k, v in weights.items()
               if not k.startswith("encoder.positional") and k != "alignment_heads"}
    model.load_weights(list(weights.items()), strict=True)
    dtype = weights["decoder.token_embedding.weight"].dtype
    if dtype in (mx.float16, mx.bfloat16, mx.float32):
        model.encoder._positions = model.encoder._positions.astype(dtype)
    mx.eval(model.parameters())
    return model, config

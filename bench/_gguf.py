"""A GGUF of a Qwen3 bench fixture for llama.cpp's llama-bench, written
with the `gguf` package (the `bench` extra; not a runtime dependency): f16, q8_0 or
q4_0 for every matrix (the embedding too, as the 4-/8-bit MLX forms
quantize it), float32 norms.  For timing decode (llama-bench -p 0 -n N),
not for text: the tokenizer is the fixture's byte-level BPE, its token
list padded with unused entries to the embedding's rows.
"""

from __future__ import annotations

import json
from pathlib import Path

NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
         "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def _name(key: str) -> str:
    key = key.removesuffix(".weight")
    if key == "model.embed_tokens":
        return "token_embd.weight"
    if key == "model.norm":
        return "output_norm.weight"
    if key == "lm_head":
        return "output.weight"
    _, _, n, rest = key.split(".", 3)       # model.layers.N.<rest>
    return f"blk.{n}.{NAMES[rest]}.weight"


def write(model_dir: Path, out: Path, qtype: str) -> Path:
    """model_dir: a bf16 / float32 Qwen3 checkpoint; qtype: f16, q8_0, q4_0."""
    import gguf
    import mlx.core as mx
    import numpy as np

    if out.is_file():
        return out
    cfg = json.loads((model_dir / "config.json").read_text())
    if cfg["model_type"] != "qwen3":
        raise ValueError("only the Qwen3 bench fixtures")
    w = gguf.GGUFWriter(str(out) + ".tmp", "qwen3")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_file_type({"f16": gguf.LlamaFileType.MOSTLY_F16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                     "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[qtype])
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    vocab = dict(tok["model"]["vocab"])
    vocab.update({a["content"]: a["id"] for a in tok.get("added_tokens", [])})
    tokens = [f"[PAD{i}]" for i in range(cfg["vocab_size"])]
    types = [gguf.TokenType.UNUSED] * cfg["vocab_size"]
    for t, i in vocab.items():
        tokens[i], types[i] = t, gguf.TokenType.NORMAL
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]])
    w.add_eos_token_id(cfg["eos_token_id"])
    qt = {"f16": gguf.GGMLQuantizationType.F16, "q8_0": gguf.GGMLQuantizationType.Q8_0,
          "q4_0": gguf.GGMLQuantizationType.Q4_0}[qtype]
    for path in sorted(model_dir.glob("*.safetensors")):
        for key, a in mx.load(str(path)).items():
            data = np.asarray(a.astype(mx.float32))
            if data.ndim == 1:
                w.add_tensor(_name(key), data)
            elif qt == gguf.GGMLQuantizationType.F16:
                w.add_tensor(_name(key), data.astype(np.float16))
            else:
                w.add_tensor(_name(key), gguf.quants.quantize(data, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    Path(str(out) + ".tmp").rename(out)
    return out

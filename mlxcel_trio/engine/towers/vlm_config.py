"""An integrated VLM's config.json: its image family and its text model's config.

Pure JSON (nothing heavy is imported), read by the towers, the loader and the
pre-load checks alike.
"""

from __future__ import annotations

from .registry import image_family


def family(config: dict) -> str | None:
    """The image family of a config.json, or None (not a VLM served here)."""
    row = image_family(config)
    return None if row is None else row.name


def is_vlm(config: dict) -> bool:
    """An integrated VLM of a family served here (decided from config.json)."""
    return image_family(config) is not None


def dynamic(config: dict) -> bool:
    """Whether the family's image grid follows each image's size (a token
    budget applies: Pixtral, Mistral 3)."""
    row = image_family(config)
    return row is not None and row.dynamic


def text_config(config: dict) -> dict:
    """The language model's own config: `text_config`, with the top-level
    fields a VLM config keeps there (vocab size, EOS, quantization)."""
    text = dict(config["text_config"])
    for key in ("vocab_size", "eos_token_id", "quantization", "quantization_config"):
        if key in config and key not in text:
            text[key] = config[key]
    text.setdefault("model_type", image_family(config).text_type)
    # transformers' llava configs list only what differs from the text
    # family's defaults (llava-1.5's is six keys): fill in LlamaConfig's
    if text["model_type"] == "llama":
        text = {**LLAMA_DEFAULTS, **text}
    # the text families llava wraps (llama, mistral, qwen2) default to an
    # untied head; mlx-lm's llama would otherwise drop lm_head and tie it
    text.setdefault("tie_word_embeddings", False)
    return text


LLAMA_DEFAULTS = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                       num_attention_heads=32, rms_norm_eps=1e-6, rope_theta=10000.0,
                       max_position_embeddings=2048, vocab_size=32000)


def flat_config(config: dict) -> dict:
    """config.json as the loader's summary reads it: the text model's sizes
    (context, width, vocabulary) at the top, the VLM's model_type kept."""
    if not is_vlm(config):
        return config
    return {**text_config(config), **{k: v for k, v in config.items()
                                      if k not in ("text_config", "vision_config")}}



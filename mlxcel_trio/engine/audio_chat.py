"""Audio input to a chat model: Gemma 3n's conformer tower beside mlx-lm's
text model.

A Gemma 3n checkpoint (Hugging Face's layout) holds the language model under
`model.language_model.*`, which mlx-lm's `gemma3n` builds directly (its
sanitize drops the towers), and the audio conformer and its embedder under
`model.audio_tower.*` / `model.embed_audio.*`.  mlx-vlm (the optional
`media` extra) supplies only those two modules; the front end (Gemma 3n's
log-mel features, Gemma3nAudioFeatureExtractor's algorithm) is ported here
in numpy, read from preprocessor_config.json, so transformers is not needed
(engine/towers/gemma3n_audio.py; this module holds the checkpoint-level
facts: which configs have an audio tower, the text model's config and the
mlx-lm loading hook).

As with images (vision.py), a request's clips are encoded once, on the
engine thread, when its job is admitted: each clip's features replace its
`<audio_soft_token>` run while the prompt is prefilled into a fresh cache,
and the sequence then decodes in the shared batch.  The run is the
processor's layout, `<start_of_audio>` + N x `<audio_soft_token>` +
`<end_of_audio>`, N being the checkpoint's `audio_soft_tokens_per_image`
(188): a clip's tower output is padded to N with the embedder's padding row,
as the reference model does.  The tower hears 30 s per run (the front end's
window), so the server gives a longer clip one run per 30-second piece.  Ids of the audio range (`<end_of_audio>` and
up) take the audio embedder's own rows and ids of the image range its image
embedder's; per-layer inputs of those ids are zero (mlx-lm's model derives
them from the ids the same way).  The text embeddings are Gemma's scaled
ones (x sqrt(width)).

Gemma 3n's image tower (MobileNet-v5) is not loaded: an image part sent to
such a checkpoint is refused.
"""

from __future__ import annotations

from .towers.registry import audio_family


def is_audio_chat(config: dict) -> bool:
    """A chat checkpoint with an audio tower of a family served here
    (towers/registry.py's AUDIO rows)."""
    return audio_family(config) is not None


def flat_config(config: dict) -> dict:
    """config.json as the loader's summary reads it: the text model's sizes
    (context, width, vocabulary) at the top, the checkpoint's model_type kept."""
    if not is_audio_chat(config):
        return config
    rest = {k: v for k, v in config.items()
            if k not in ("text_config", "audio_config", "vision_config")}
    return {**config["text_config"], **rest}


def model_classes(config: dict):
    """mlx-lm's `get_model_classes` hook: mlx-lm's own class for a Gemma 3n
    checkpoint, reading either layout of its tensors (Hugging Face's
    `model.language_model.*`, or mlx-vlm's `language_model.model.*` beside
    top-level tower tensors); any other checkpoint goes to vision.py's hook."""
    from .vision import model_classes as other_classes

    base_model, base_args = other_classes(config)
    if not is_audio_chat(config):
        return base_model, base_args

    class LanguageModel(base_model):
        def sanitize(self, weights: dict) -> dict:
            own = {}
            for k, v in weights.items():
                if k.startswith(_MLX_VLM_TEXT):
                    own[_HF_TEXT + k[len(_MLX_VLM_TEXT):]] = v
                elif not k.startswith(_MLX_VLM_TOWERS):
                    own[k] = v
            return super().sanitize(own)

    LanguageModel.__name__ = base_model.__name__
    return LanguageModel, base_args


_HF_TEXT, _MLX_VLM_TEXT = "model.language_model.", "language_model.model."
_MLX_VLM_TOWERS = ("audio_tower.", "embed_audio.", "vision_tower.", "embed_vision.")


def problem(config: dict) -> str | None:
    """Why the audio tower cannot be built, or None."""
    import importlib.util

    if importlib.util.find_spec("mlx_vlm") is None:
        return ("this checkpoint has an audio tower, which needs the optional 'media' extra "
                "(pip install 'mlxcel-trio[media]')")
    return None

"""Gemma 3n's audio tower: its conformer and embedder, and the log-mel front end.

mlx-vlm (the optional `media` extra) supplies the conformer and the
embedder; the front end (Gemma3nAudioFeatureExtractor's algorithm) is ported
here in numpy, read from preprocessor_config.json, so transformers is not
needed.  engine/audio_chat.py tells how clips become soft tokens.
"""

from __future__ import annotations

import glob
import json
import math
from pathlib import Path
from typing import Sequence

import mlx.core as mx
import numpy as np

from ...protocol.records import AudioInfo, AudioInput
from .base import load_parts, prefill_embeddings

_PREFIXES = {"audio_tower": ("model.audio_tower.", "audio_tower."),
             "embed_audio": ("model.embed_audio.", "embed_audio."),
             "embed_vision": ("model.embed_vision.", "embed_vision.")}
MAX_CLIP_SAMPLES = 480_000  # the feature extractor's max_length: 30 s at 16 kHz


# -- the front end ---------------------------------------------------------------

class MelFrontEnd:
    """Gemma3nAudioFeatureExtractor's features, in numpy: frames of
    frame_length + 1 samples every hop, HTK pre-emphasis, a periodic Hann
    window, |rFFT| (the FFT doubled: "overdrive"), a triangular mel bank
    without normalization, log with a floor, optional per-bin statistics.
    The waveform is right-padded with zeros to a multiple of 128 samples;
    frames over the padding are masked."""

    def __init__(self, cfg: dict) -> None:
        self.rate = int(cfg.get("sampling_rate", 16_000))
        self.n_mels = int(cfg.get("feature_size", 128))
        self.frame = round(self.rate * float(cfg.get("frame_length_ms", 32.0)) / 1000)
        self.hop = round(self.rate * float(cfg.get("hop_length_ms", 10.0)) / 1000)
        fft = 2 ** math.ceil(math.log2(self.frame))
        self.fft = fft * 2 if cfg.get("fft_overdrive", True) else fft
        self.preemphasis = float(cfg.get("preemphasis", 0.97))
        self.htk = bool(cfg.get("preemphasis_htk_flavor", True))
        self.scale = float(cfg.get("input_scale_factor", 1.0))
        self.floor = float(cfg.get("mel_floor", 1e-5))
        n = np.arange(self.frame, dtype=np.float32)
        self.window = (0.5 * (1 - np.cos(2 * np.pi * n / self.frame))).astype(np.float32)
        self.bank = _mel_bank(self.fft // 2 + 1, float(cfg.get("min_frequency", 125.0)),
                              float(cfg.get("max_frequency", 7600.0)), self.n_mels,
                              self.rate, self.fft)
        mean, std = cfg.get("per_bin_mean"), cfg.get("per_bin_stddev")
        self.mean = None if mean is None else np.asarray(mean, np.float64)
        self.std = None if std is None else np.asarray(std, np.float64)

    def __call__(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(features [frames, n_mels] float32, padding mask [frames], True = padding)."""
        wave = np.asarray(samples, np.float32)[:MAX_CLIP_SAMPLES]
        n = len(wave)
        padded = -(-max(n, 1) // 128) * 128
        wave = np.pad(wave, (0, padded - n)) * self.scale
        size = self.frame + 1
        count = (padded - size) // self.hop + 1
        if count <= 0:
            return np.zeros((0, self.n_mels), np.float32), np.zeros((0,), bool)
        frames = np.lib.stride_tricks.sliding_window_view(wave, size)[::self.hop][:count]
        if self.preemphasis > 0:
            if self.htk:
                frames = np.concatenate([frames[:, :1] * (1 - self.preemphasis),
                                         frames[:, 1:-1] - self.preemphasis * frames[:, :-2]],
                                        axis=-1)
            else:
                frames = frames[:, 1:] - self.preemphasis * frames[:, :-1]
        else:
            frames = frames[:, :-1]
        spec = np.abs(np.fft.rfft(frames * self.window, n=self.fft, axis=-1))
        mel = np.log(np.maximum(spec @ self.bank, self.floor))
        if self.mean is not None:
            mel = mel - self.mean
        if self.std is not None:
            mel = mel / self.std
        real = np.arange(padded)[::self.hop][:count] < n
        return mel.astype(np.float32), ~real


def _mel_bank(n_freqs: int, f_min: float, f_max: float, n_mels: int, rate: int,
              fft: int) -> np.ndarray:
    """Triangular filters on the HTK mel scale, [n_freqs, n_mels], unnormalized."""
    freqs = np.arange(n_freqs, dtype=np.float32) * (rate / fft)
    m = np.linspace(2595.0 * math.log10(1 + f_min / 700), 2595.0 * math.log10(1 + f_max / 700),
                    n_mels + 2)
    f = 700.0 * (10 ** (m / 2595.0) - 1.0)
    diff = f[1:] - f[:-1]
    slopes = f[None, :] - freqs[:, None]
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    return np.maximum(0.0, np.minimum(down, up))


# -- the tower --------------------------------------------------------------------


class Gemma3nAudioTower:
    """Gemma 3n's audio conformer and embedder (mlx-vlm's modules), its
    image embedder's token rows when the checkpoint has them, and the
    front end."""

    def __init__(self, tower, embed_audio, embed_vision, front: MelFrontEnd, *,
                 info: AudioInfo, text_vocab: int, padding_id: int) -> None:
        self.tower, self.embed_audio, self.embed_vision = tower, embed_audio, embed_vision
        self.front = front
        self.info = info
        self.text_vocab = text_vocab      # vocab_size_per_layer_input: the text ids
        self.padding_id = padding_id      # the audio embedder's padding row (its last id)

    @classmethod
    def load(cls, path: Path, config: dict, dtype,
             budget: tuple[int, int] = (0, 0)) -> "Gemma3nAudioTower":
        from mlx_vlm.models.gemma3n.audio import AudioModel
        from mlx_vlm.models.gemma3n.config import AudioConfig, TextConfig, VisionConfig
        from mlx_vlm.models.gemma3n.gemma3n import Gemma3nMultimodalEmbedder

        tcfg = TextConfig.from_dict(config["text_config"])
        acfg = AudioConfig.from_dict(config["audio_config"])
        weights: dict[str, mx.array] = {}
        wanted = tuple(p for ps in _PREFIXES.values() for p in ps)
        for f in sorted(glob.glob(str(path / "model*.safetensors"))):
            weights.update({k: v for k, v in mx.load(f).items() if k.startswith(wanted)})

        def own(part: str) -> dict:
            return {k[len(p):]: v for k, v in weights.items() for p in _PREFIXES[part]
                    if k.startswith(p)}

        tower, embed_audio = AudioModel(acfg), Gemma3nMultimodalEmbedder(acfg, tcfg)
        parts = [(tower, tower.sanitize(own("audio_tower"))), (embed_audio, own("embed_audio"))]
        embed_vision = None
        vision_w = own("embed_vision")
        if vision_w and isinstance(config.get("vision_config"), dict):
            vcfg = VisionConfig.from_dict(config["vision_config"])
            embed_vision = Gemma3nMultimodalEmbedder(vcfg, tcfg)
            parts.append((embed_vision, vision_w))
        if not parts[0][1] or not parts[1][1]:
            raise ValueError(f"{path}: config.json declares an audio tower but the weights "
                             "hold no audio_tower / embed_audio tensors")
        load_parts(parts, config.get("quantization"), dtype)
        pre = path / "preprocessor_config.json"
        front = MelFrontEnd(json.loads(pre.read_text()) if pre.exists() else {})
        if front.n_mels != acfg.input_feat_size:
            raise ValueError(f"{path}: preprocessor_config.json makes {front.n_mels} mel bins "
                             f"but the audio tower takes {acfg.input_feat_size}")
        info = AudioInfo(audio_token=int(config.get("audio_token_id", 262273)),
                         tokens_per_clip=int(config.get("audio_soft_tokens_per_image", 188)),
                         begin_token=int(config.get("boa_token_id", 256000)),
                         end_token=int(config.get("eoa_token_id", 262272)))
        return cls(tower, embed_audio, embed_vision, front, info=info,
                   text_vocab=tcfg.vocab_size_per_layer_input,
                   padding_id=tcfg.vocab_size - 1)

    def encode_clip(self, clip: AudioInput) -> mx.array:
        """[tokens_per_clip, text width]: one clip's soft tokens, the tower's
        output padded (or cut) to the placeholder count."""
        feats, pad = self.front(np.frombuffer(clip.samples, np.float32))
        n = self.info.tokens_per_clip
        padding = self.embed_audio(input_ids=mx.array([[self.padding_id]]))[0]  # [1, width]
        if len(feats) == 0:
            return mx.broadcast_to(padding, (n, padding.shape[-1]))
        x = mx.array(feats)[None].astype(self._float())
        out, mask = self.tower(x, mx.array(pad)[None])
        soft = self.embed_audio(inputs_embeds=out)[0]
        soft = mx.where(mask[0][:, None], padding, soft)[:n]
        if soft.shape[0] < n:
            soft = mx.concatenate(
                [soft, mx.broadcast_to(padding, (n - soft.shape[0], soft.shape[-1]))])
        return soft

    def embed_ids(self, ids: mx.array, text: mx.array) -> mx.array:
        """Token embeddings as the reference model makes them: `text` (the
        scaled text rows) for text ids, each multimodal embedder's own rows
        for the ids of its range."""
        out = text
        audio_from = self.embed_audio.vocab_offset
        if self.embed_vision is not None:
            lo = self.embed_vision.vocab_offset
            in_range = (ids >= lo) & (ids < audio_from)
            if in_range.any().item():
                dummy = lo + self.embed_vision.vocab_size - 1
                rows = self.embed_vision(input_ids=mx.where(in_range, ids, dummy))
                out = mx.where(in_range[:, None], rows.astype(out.dtype), out)
        in_audio = ids >= audio_from
        if in_audio.any().item():
            dummy = audio_from + self.embed_audio.vocab_size - 1
            rows = self.embed_audio(input_ids=mx.where(in_audio, ids, dummy))
            out = mx.where(in_audio[:, None], rows.astype(out.dtype), out)
        return out

    def _float(self):
        from mlx.utils import tree_flatten

        return next((p.dtype for _, p in tree_flatten(self.tower.parameters())
                     if mx.issubdtype(p.dtype, mx.floating)), mx.float32)

    def encode(self, clips: Sequence[AudioInput]) -> list[mx.array]:
        """Each clip's soft tokens (`encode_clip`)."""
        return [self.encode_clip(clip) for clip in clips]

    @staticmethod
    def text_dtype(model):
        """The text model's served float type, which the tower takes."""
        return text_model(model).embed_tokens.weight.dtype

    def prefill(self, model, prompt: Sequence[int], clips: Sequence[AudioInput],
                caches: list, step: int) -> int:
        """Run `prompt` but its last token through `model` into `caches`, each
        clip's soft tokens in place of its placeholder run; returns the number
        of tokens the caches now hold (the last token is left for the batch
        generator, as an image tower's prefill does)."""
        n = len(prompt) - 1
        ids = mx.array(list(prompt[:n]))
        lm = text_model(model)
        h = self.embed_ids(ids, lm.embed_tokens(ids) * (lm.hidden_size ** 0.5))
        t = self.info.tokens_per_clip
        for clip in clips:
            end = min(clip.start + t, n)
            if end > clip.start:
                h[clip.start:end] = self.encode_clip(clip)[:end - clip.start].astype(h.dtype)
        return prefill_embeddings(model, ids, h, caches, step)

    def span(self, clip: AudioInput) -> int:
        """How many prompt positions the clip's run takes."""
        return self.info.tokens_per_clip

    def spans_ok(self, prompt: Sequence[int], clips: Sequence[AudioInput]) -> bool:
        """Every clip's placeholder run lies inside the prompt, in order, made of
        the audio soft token (a job built by the server always is)."""
        info = self.info
        end = 0
        for clip in clips:
            if clip.start < end or clip.start + info.tokens_per_clip > len(prompt):
                return False
            end = clip.start + info.tokens_per_clip
            if any(t != info.audio_token for t in prompt[clip.start:end]):
                return False
        return True


def text_model(model):
    """mlx-lm's gemma3n language model (embeddings, width)."""
    inner = getattr(getattr(model, "model", None), "language_model", None)
    if inner is None or not hasattr(inner, "embed_tokens"):
        raise ValueError("this language model exposes no token embedding to place audio in")
    return inner

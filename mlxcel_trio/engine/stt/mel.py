"""Whisper's log-Mel front end in numpy: 16 kHz, a 400-point periodic Hann
window, hop 160, Slaney-scale Mel filters, 30 s windows of 3000 frames.

The arithmetic is the reference implementation's: a centred, reflect-padded
STFT whose last frame is dropped, power spectrum, Mel projection, log10
floored at 1e-10, clipped to 8 decades below the clip's maximum, then
scaled by (x + 4) / 4.  The clip is padded with one window of silence
before the spectrogram, as the reference does, so every window can be cut
from it without a second pass.  A window is what the encoder takes, twice
its n_audio_ctx: 30 s for every released Whisper (a test checkpoint may
have a shorter one).  Pure numpy: no MLX, no trio.
"""

from __future__ import annotations

import functools

import numpy as np

SAMPLE_RATE = 16_000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_SECONDS = 30
N_SAMPLES = CHUNK_SECONDS * SAMPLE_RATE     # samples in a window
N_FRAMES = N_SAMPLES // HOP_LENGTH          # Mel frames in a window (3000)


def _hz_to_mel(f):
    f = np.asarray(f, np.float64)
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    logstep = np.log(6.4) / 27.0
    return np.where(f >= min_log_hz,
                    min_log_hz / f_sp + np.log(np.maximum(f, min_log_hz) / min_log_hz) / logstep,
                    f / f_sp)


def _mel_to_hz(m):
    m = np.asarray(m, np.float64)
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)


@functools.lru_cache(maxsize=4)
def mel_filters(n_mels: int) -> np.ndarray:
    """Slaney-normalized triangular filters [n_mels, N_FFT // 2 + 1]."""
    fft_freqs = np.linspace(0, SAMPLE_RATE / 2, 1 + N_FFT // 2)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(SAMPLE_RATE / 2), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2:n_mels + 2] - mel_f[:n_mels]))[:, None]
    return weights.astype(np.float32)


def log_mel(samples: np.ndarray, n_mels: int, n_frames: int = N_FRAMES) -> np.ndarray:
    """The log-Mel spectrogram [frames, n_mels] of `samples` (16 kHz mono)
    followed by one window (`n_frames`) of silence."""
    audio = np.concatenate([np.asarray(samples, np.float32),
                            np.zeros(n_frames * HOP_LENGTH, np.float32)])
    pad = N_FFT // 2
    padded = np.pad(audio, (pad, pad), mode="reflect")
    count = 1 + (len(padded) - N_FFT) // HOP_LENGTH
    frames = np.lib.stride_tricks.as_strided(
        padded, (count, N_FFT), (padded.strides[0] * HOP_LENGTH, padded.strides[0]))
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)
    power = np.abs(np.fft.rfft(frames * window, axis=-1)[:-1]) ** 2
    mel = power.astype(np.float32) @ mel_filters(n_mels).T
    log_spec = np.log10(np.maximum(mel, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)


def windows(samples: np.ndarray, n_mels: int, n_frames: int = N_FRAMES) -> list[np.ndarray]:
    """The clip as consecutive windows of `n_frames` Mel frames each (the
    encoder's input: 2 * n_audio_ctx, 3000 = 30 s for every released
    Whisper); a clip of any length (even empty) gives at least one."""
    mel = log_mel(samples, n_mels, n_frames)
    n_content = max(1, len(samples) // HOP_LENGTH)
    return [np.ascontiguousarray(mel[start:start + n_frames])
            for start in range(0, n_content, n_frames)]

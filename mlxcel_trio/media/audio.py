"""Audio clips in, 16 kHz mono float32 samples out, within fixed bounds.

The accepted set is upstream's (WAV, MP3, FLAC), identified from the clip's
own magic bytes, never from a file name or a format the client states.  The
bounds apply before the decoder runs, from the container's header: at most
`MAX_SAMPLE_RATE` Hz, `MAX_CHANNELS` channels and `MAX_SECONDS` seconds.  A
compressed header can understate its length, so the decoder reads in blocks
and stops once the frame count passes the same cap: a lying header costs
one block, never an unbounded allocation.  A FLAC file's metadata-block
chain is walked first (every block must fit inside the file and STREAMINFO
must come first), so the decoder never reads a field sized by a broken
chain.

Decoding is libsndfile (the `soundfile` wheel bundles it, MP3 included);
resampling is scipy's polyphase filter.  Everything here is pure and
synchronous: the server calls `decode` from a worker thread.  A clip that
cannot be used raises `AudioError` with a sentence for the client (a 400).
"""

from __future__ import annotations

import io
import math

import numpy as np

from .limits import AUDIO_FILE_BYTES

SAMPLE_RATE = 16_000          # what Whisper-style front ends take
MAX_SAMPLE_RATE = 192_000
MAX_CHANNELS = 8
MAX_SECONDS = 600
MAX_FILE_BYTES = AUDIO_FILE_BYTES
_BLOCK_FRAMES = 1 << 16

FORMATS = ("WAV", "MP3", "FLAC")


class AudioError(ValueError):
    """A clip that cannot be decoded or is out of bounds; the message is the
    client's answer."""


def container_of(data: bytes) -> str | None:
    """"WAV", "MP3" or "FLAC" from the first bytes, else None."""
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "WAV"
    if data[:4] == b"fLaC":
        return "FLAC"
    if data[:3] == b"ID3":
        return "MP3"
    # an MPEG audio frame header: 11 sync bits, a valid version and layer
    if len(data) >= 2 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0:
        version, layer = (data[1] >> 3) & 3, (data[1] >> 1) & 3
        if version != 1 and layer != 0:
            return "MP3"
    return None


def _check_geometry(rate: int, channels: int, frames: int | None) -> None:
    if rate <= 0 or channels <= 0:
        raise AudioError("audio file is malformed: its header states no sample rate or "
                         "no channels")
    if rate > MAX_SAMPLE_RATE:
        raise AudioError(f"audio sample rate {rate} Hz exceeds the limit of "
                         f"{MAX_SAMPLE_RATE} Hz")
    if channels > MAX_CHANNELS:
        raise AudioError(f"audio file has {channels} channels; at most {MAX_CHANNELS} are "
                         "accepted")
    if frames is not None and frames > MAX_SECONDS * rate:
        raise AudioError(f"audio clip is {frames / rate:.1f} s long; at most {MAX_SECONDS} s "
                         "are accepted")


def _walk_flac(data: bytes) -> None:
    """FLAC's metadata chain: STREAMINFO first, every block inside the file,
    a last-block flag before the data; its geometry checked from STREAMINFO."""
    pos, first = 4, True
    while True:
        if pos + 4 > len(data):
            raise AudioError("audio file is truncated: a FLAC metadata block header runs "
                             "past the end of the file")
        header = data[pos]
        kind, last = header & 0x7F, bool(header & 0x80)
        length = int.from_bytes(data[pos + 1:pos + 4], "big")
        body = pos + 4
        if kind == 127:
            raise AudioError("audio file is malformed: invalid FLAC metadata block type")
        if body + length > len(data):
            raise AudioError("audio file is truncated: a FLAC metadata block runs past the "
                             "end of the file")
        if first:
            if kind != 0 or length != 34:
                raise AudioError("audio file is malformed: a FLAC stream must start with "
                                 "its 34-byte STREAMINFO block")
            info = int.from_bytes(data[body + 10:body + 18], "big")
            rate, channels = info >> 44, ((info >> 41) & 7) + 1
            frames = info & ((1 << 36) - 1)
            _check_geometry(rate, channels, frames or None)
            first = False
        pos = body + length
        if last:
            return


def _read(data: bytes, container: str) -> tuple[np.ndarray, int]:
    """Frames [n, channels] (float32) and the sample rate, within the caps."""
    import soundfile as sf

    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            rate, channels = int(f.samplerate), int(f.channels)
            declared = int(f.frames) if f.frames and f.frames > 0 else None
            _check_geometry(rate, channels, declared)
            cap = MAX_SECONDS * rate
            blocks, total = [], 0
            while True:
                block = f.read(_BLOCK_FRAMES, dtype="float32", always_2d=True)
                if not len(block):
                    break
                total += len(block)
                if total > cap:  # the header understated the length
                    raise AudioError(f"audio clip is longer than {MAX_SECONDS} s; at most "
                                     f"{MAX_SECONDS} s are accepted")
                blocks.append(block)
    except AudioError:
        raise
    except (sf.LibsndfileError, RuntimeError, ValueError, TypeError) as exc:
        raise AudioError(f"audio file is malformed or truncated ({container}): "
                         f"{_libsndfile_reason(exc)}") from None
    if not blocks:
        raise AudioError(f"audio file holds no samples ({container})")
    frames = np.concatenate(blocks) if len(blocks) > 1 else blocks[0]
    if not np.isfinite(frames).all():
        raise AudioError(f"audio file is malformed ({container}): it decodes to samples "
                         "that are not finite numbers")
    return frames, rate


def _libsndfile_reason(exc: Exception) -> str:
    text = str(getattr(exc, "error_string", "") or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def to_mono_16k(frames: np.ndarray, rate: int) -> np.ndarray:
    """Average the channels, then resample to SAMPLE_RATE (polyphase)."""
    mono = frames.mean(axis=1, dtype=np.float32) if frames.ndim == 2 else frames
    if rate == SAMPLE_RATE:
        return np.ascontiguousarray(mono, np.float32)
    from scipy.signal import resample_poly

    g = math.gcd(rate, SAMPLE_RATE)
    return resample_poly(mono, SAMPLE_RATE // g, rate // g).astype(np.float32)


def decode(data: bytes) -> np.ndarray:
    """A clip's samples at 16 kHz mono, float32 in [-1, 1]; AudioError when
    the clip is empty, not WAV/MP3/FLAC, malformed, or out of bounds."""
    if not data:
        raise AudioError("audio file is empty")
    if len(data) > MAX_FILE_BYTES:
        raise AudioError(f"audio file is {len(data)} bytes; at most {MAX_FILE_BYTES} bytes "
                         "are accepted")
    container = container_of(data)
    if container is None:
        raise AudioError("unsupported audio format: the file is not WAV, MP3 or FLAC "
                         "(identified from its content)")
    if container == "FLAC":
        _walk_flac(data)
    frames, rate = _read(data, container)
    return to_mono_16k(frames, rate)

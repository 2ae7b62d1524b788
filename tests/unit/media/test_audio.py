"""media/audio.py: containers by content, decoding to 16 kHz mono, bounds
before the decoder, malformed files as AudioError sentences."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import soundfile as sf

from mlxcel_trio.media import audio


def _clip(fmt: str, rate: int = 16000, seconds: float = 1.0, channels: int = 1,
          subtype: str | None = None) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    x = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    frames = np.stack([x] * channels, axis=1)
    buf = io.BytesIO()
    sf.write(buf, frames, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def _wav_header(rate: int, channels: int, n_data: int) -> bytes:
    """A PCM16 WAV header declaring `n_data` bytes of samples."""
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * channels * 2, channels * 2, 16)
    return (b"RIFF" + struct.pack("<I", 36 + n_data) + b"WAVE" + b"fmt " +
            struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", n_data))


@pytest.mark.parametrize("fmt, name", [("WAV", "WAV"), ("FLAC", "FLAC"), ("MP3", "MP3")])
def test_each_accepted_container_is_identified_and_decoded(fmt, name):
    data = _clip(fmt)
    assert audio.container_of(data) == name
    samples = audio.decode(data)
    assert samples.dtype == np.float32 and samples.ndim == 1
    # MP3 carries encoder delay and padding; the others are exact
    assert abs(len(samples) - 16000) <= (2000 if fmt == "MP3" else 0)
    assert 0.2 < float(np.abs(samples).max()) < 0.4


def test_stereo_44k_becomes_mono_16k():
    samples = audio.decode(_clip("WAV", rate=44100, seconds=0.5, channels=2))
    assert len(samples) == 8000
    # the 440 Hz tone survives the resampling: its spectrum peaks there
    spectrum = np.abs(np.fft.rfft(samples))
    assert abs(np.argmax(spectrum) * 16000 / len(samples) - 440) < 5


def test_the_container_comes_from_content_not_from_a_name():
    ogg = _clip("OGG", subtype="VORBIS")
    assert audio.container_of(ogg) is None
    with pytest.raises(audio.AudioError, match="not WAV, MP3 or FLAC"):
        audio.decode(ogg)
    with pytest.raises(audio.AudioError, match="not WAV, MP3 or FLAC"):
        audio.decode(b"hello, this is text and not a clip")
    with pytest.raises(audio.AudioError, match="empty"):
        audio.decode(b"")


def test_geometry_bounds_come_from_the_header_before_decoding():
    with pytest.raises(audio.AudioError, match="9 channels; at most 8"):
        audio.decode(_clip("WAV", rate=8000, seconds=0.01, channels=9))
    with pytest.raises(audio.AudioError, match="200000 Hz exceeds the limit of 192000 Hz"):
        audio.decode(_wav_header(200000, 1, 400) + bytes(400))


def test_a_flac_header_claiming_hours_is_refused_before_the_decoder():
    data = bytearray(_clip("FLAC", seconds=0.1))
    info = int.from_bytes(data[8 + 10:8 + 18], "big")
    info = (info & ~((1 << 36) - 1)) | (16000 * 3600)   # total samples: one hour
    data[8 + 10:8 + 18] = info.to_bytes(8, "big")
    with pytest.raises(audio.AudioError, match="3600.0 s long; at most 600 s"):
        audio.decode(bytes(data))


def test_a_broken_flac_metadata_chain_is_refused():
    data = _clip("FLAC", seconds=0.1)
    with pytest.raises(audio.AudioError, match="truncated"):
        audio.decode(data[:20])
    bad = bytearray(data)
    bad[4] = 0x05   # the first block is not STREAMINFO
    with pytest.raises(audio.AudioError, match="STREAMINFO"):
        audio.decode(bytes(bad))


def test_a_decoded_length_past_the_cap_is_caught_while_reading(monkeypatch):
    monkeypatch.setattr(audio, "MAX_SECONDS", 1)
    # as if the header understated the length: the header check lets it through,
    # the frame count read back stops it
    monkeypatch.setattr(audio, "_check_geometry", lambda rate, channels, frames: None)
    with pytest.raises(audio.AudioError, match="longer than 1 s"):
        audio.decode(_clip("MP3", seconds=3))


def test_malformed_and_truncated_files_name_the_problem():
    with pytest.raises(audio.AudioError, match=r"malformed or truncated \(WAV\)"):
        audio.decode(b"RIFF\x10\x00\x00\x00WAVEjunkjunk")
    with pytest.raises(audio.AudioError, match=r"\(MP3\)"):
        audio.decode(b"ID3" + bytes(64))


def test_an_oversized_file_is_refused_before_anything_is_read():
    with pytest.raises(audio.AudioError, match="at most 26214400 bytes"):
        audio.decode(b"RIFF" + bytes(audio.MAX_FILE_BYTES))

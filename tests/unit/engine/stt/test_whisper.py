"""engine/stt: the MLX Whisper and its front end against mlx-audio's
reference port (same weights, same numbers), and the transcriber's job
protocol (deterministic, pieces concatenate to the result, cancel, caps)."""

from __future__ import annotations

import numpy as np
import pytest

from mlxcel_trio.engine.stt import mel
from mlxcel_trio.engine.stt.transcriber import Transcriber, checkpoint_problem, is_whisper
from mlxcel_trio.protocol.records import Failed, TranscribeJob, Transcribed, TranscriptPiece
from mlxcel_trio.server.http.errors import ApiError

RATE = 16000


@pytest.fixture(scope="module")
def path():
    from fixtures.build import ensure
    return ensure("tiny-whisper")


@pytest.fixture(scope="module")
def transcriber(path):
    return Transcriber.load(path)


def _tone(seconds: float = 2.0, hz: float = 440.0) -> np.ndarray:
    return (0.3 * np.sin(2 * np.pi * hz * np.arange(int(RATE * seconds)) / RATE)).astype(
        np.float32)


def _run(t: Transcriber, job: TranscribeJob, cancel_after: int | None = None) -> list:
    out: list = []
    t.submit(job, out)
    steps = 0
    while t.pending:
        t.step(out)
        steps += 1
        if cancel_after is not None and steps == cancel_after:
            assert t.cancel(job.id)
    return out


def test_the_model_and_front_end_match_mlx_audio(path):
    mx = pytest.importorskip("mlx.core")
    ref_whisper = pytest.importorskip("mlx_audio.stt.models.whisper.whisper")
    from mlx_audio.stt.models.whisper.audio import log_mel_spectrogram

    from mlxcel_trio.engine.stt import whisper

    ours, config = whisper.load(path)
    dims = ref_whisper.ModelDimensions.from_dict(
        {k: v for k, v in config.items() if k != "multilingual"})
    ref = ref_whisper.Model(dims, mx.float32)
    ref.load_weights(str(path / "weights.safetensors"))
    x = _tone(3.0)
    ours_mel = mel.log_mel(x, 80)
    ref_mel = np.array(log_mel_spectrogram(mx.array(x), 80, padding=mel.N_SAMPLES))
    np.testing.assert_allclose(ours_mel, ref_mel[:len(ours_mel)], atol=1e-4)
    window = mx.array(mel.windows(x, 80, 2 * config["n_audio_ctx"])[0])[None]
    feats = ours.encoder(window)
    np.testing.assert_allclose(np.array(feats), np.array(ref.encoder(window)), atol=1e-4)
    tokens = mx.array([[601, 602, 606, 610, 5, 77, 300]])
    logits, cache = ours.decoder(tokens[:, :6], feats, None)
    step, _ = ours.decoder(tokens[:, 6:], feats, cache)   # one more token on the cache
    want = np.array(ref.decoder(tokens, feats)[0])
    np.testing.assert_allclose(np.array(logits), want[:, :6], atol=1e-4)
    np.testing.assert_allclose(np.array(step)[:, 0], want[:, 6], atol=1e-4)


def test_windows_cut_a_clip_into_encoder_sized_mel_blocks():
    assert [w.shape for w in mel.windows(np.zeros(RATE * 31, np.float32), 80)] == \
        [(3000, 80), (3000, 80)]   # Whisper's 30 s
    assert [w.shape for w in mel.windows(np.zeros(RATE * 4, np.float32), 80, 300)] == \
        [(300, 80), (300, 80)]
    assert len(mel.windows(np.zeros(0, np.float32), 80)) == 1


def test_the_checkpoint_is_recognised_and_checked(path, tmp_path):
    assert is_whisper(path) and checkpoint_problem(path) is None
    (tmp_path / "config.json").write_text('{"model_type": "whisper", "n_mels": 80}')
    assert "lacks the Whisper dimension(s) n_audio_ctx" in checkpoint_problem(tmp_path)


def test_a_transcript_is_deterministic_and_its_pieces_are_its_text(transcriber):
    first = _run(transcriber, TranscribeJob(1, _tone()))
    again = _run(transcriber, TranscribeJob(2, _tone()))
    done = first[-1]
    assert isinstance(done, Transcribed) and done.text and done.n_tokens > 0
    assert again[-1].text == done.text
    pieces = [ev for ev in first if isinstance(ev, TranscriptPiece)]
    assert "".join(p.text for p in pieces) == done.text
    assert len(pieces) > 1   # one piece per decoded token (bar held-back UTF-8)
    # the audio reaches the model: noise is transcribed differently
    noise = np.random.default_rng(0).standard_normal(RATE * 2).astype(np.float32) * 0.1
    assert _run(transcriber, TranscribeJob(3, noise))[-1].text != done.text


def test_max_tokens_caps_the_transcript_and_a_long_clip_has_windows(transcriber):
    capped = _run(transcriber, TranscribeJob(1, _tone(), max_tokens=3))[-1]
    assert capped.n_tokens == 3
    long = _run(transcriber, TranscribeJob(2, _tone(4.0)))[-1]   # two 3 s windows
    one = _run(transcriber, TranscribeJob(3, _tone(2.0)))[-1]
    assert long.n_tokens > one.n_tokens   # a second window decoded


def test_cancel_drops_the_running_job(transcriber):
    out = _run(transcriber, TranscribeJob(1, _tone()), cancel_after=2)
    assert not any(isinstance(ev, Transcribed) for ev in out)
    assert not transcriber.pending


def test_an_unknown_language_fails_the_job(transcriber):
    out = _run(transcriber, TranscribeJob(1, _tone(), language="xx"))
    (failed,) = out
    assert isinstance(failed, Failed) and failed.job_id == 1
    err = ApiError.from_failed(failed)
    assert (err.type, err.message) == ("invalid_request_error",
                                       "language 'xx' is not one this model transcribes")
    assert isinstance(_run(transcriber, TranscribeJob(2, _tone(), language="de"))[-1],
                      Transcribed)


_TO_HF = ((".cross_attn_ln.", ".encoder_attn_layer_norm."), (".attn_ln.", ".self_attn_layer_norm."),
          (".mlp_ln.", ".final_layer_norm."), (".mlp1.", ".fc1."), (".mlp2.", ".fc2."),
          (".cross_attn.", ".encoder_attn."), (".attn.", ".self_attn."),
          (".query.", ".q_proj."), (".key.", ".k_proj."), (".value.", ".v_proj."),
          (".out.", ".out_proj."), ("encoder.blocks.", "encoder.layers."),
          ("decoder.blocks.", "decoder.layers."), ("encoder.ln_post.", "encoder.layer_norm."),
          ("decoder.ln.", "decoder.layer_norm."),
          ("decoder.token_embedding.", "decoder.embed_tokens."),
          ("decoder.positional_embedding", "decoder.embed_positions.weight"))


def test_transformers_layout_loads_to_the_same_model(path, tmp_path):
    """The fixture rewritten as transformers saves Whisper (names, conv
    kernels, config keys, stored encoder positions, proj_out) gives the
    same logits."""
    import json
    import shutil

    import mlx.core as mx

    from mlxcel_trio.engine.stt import whisper

    ours, config = whisper.load(path)
    hf = {}
    for key, value in mx.load(str(path / "weights.safetensors")).items():
        if key.startswith("encoder.conv") and key.endswith(".weight"):
            value = value.transpose(0, 2, 1)
        for a, b in _TO_HF:
            key = key.replace(a, b)
        hf["model." + key] = value
    hf["model.encoder.embed_positions.weight"] = mx.zeros((config["n_audio_ctx"], 64))
    hf["proj_out.weight"] = hf["model.decoder.embed_tokens.weight"]
    mx.save_safetensors(str(tmp_path / "model.safetensors"), hf)
    shutil.copy(path / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "whisper", "num_mel_bins": 80, "max_source_positions": 150,
        "d_model": 64, "encoder_attention_heads": 2, "encoder_layers": 2,
        "vocab_size": config["n_vocab"], "max_target_positions": 64,
        "decoder_attention_heads": 2, "decoder_layers": 2}))
    theirs, _ = whisper.load(tmp_path)
    assert theirs.dims == ours.dims
    mel_in = mx.array(mel.windows(_tone(), 80, 300)[0])[None]
    tokens = mx.array([[601, 602, 606, 610, 5]])
    a = ours.decoder(tokens, ours.encoder(mel_in), None)[0]
    b = theirs.decoder(tokens, theirs.encoder(mel_in), None)[0]
    np.testing.assert_array_equal(np.array(a), np.array(b))

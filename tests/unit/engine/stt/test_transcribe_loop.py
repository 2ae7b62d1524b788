"""engine/loop.py with a Whisper -m: the transcriber stepped by the loop,
one piece per token in its own step, a Cancel dropping a queued or running
job, and generation refused (NoChat)."""

from __future__ import annotations

import numpy as np

from mlxcel_trio.protocol.records import (
    Cancel,
    Failed,
    Job,
    Loaded,
    Submit,
    TranscribeJob,
    Transcribed,
    TranscriptPiece,
)
from mlxcel_trio.server.http.errors import ApiError
from tests.unit.engine.test_embed_loop import Run, _ensure


def _ended(job_ids):
    def done(seen):
        return {ev.job_id for ev in seen if isinstance(ev, (Transcribed, Failed))} >= \
            set(job_ids)
    return done


def test_a_whisper_engine_transcribes_cancels_and_refuses_generation():
    tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(16000) / 16000)).astype(np.float32)
    commands = [Submit(TranscribeJob(1, tone)), Submit(TranscribeJob(2, tone)), Cancel(2),
                Submit(Job(3, (5, 6), n_predict=2)), Submit(TranscribeJob(4, tone))]
    run = Run(_ensure("tiny-whisper"), commands)
    try:
        seen = run.until(_ended([1, 3, 4]))
    finally:
        run.stop()
    loaded = next(ev for ev in seen if isinstance(ev, Loaded)).info
    assert not loaded.generates and loaded.transcriber.languages == ("de", "en", "fr")
    assert not any(getattr(ev, "job_id", None) == 2 for ev in seen)   # cancelled while queued
    assert [ApiError.from_failed(ev).message for ev in seen if isinstance(ev, Failed)] == [
        "This server does not support generation: it serves a speech-to-text model"]
    results = {ev.job_id: ev for ev in seen if isinstance(ev, Transcribed)}
    assert results[1].text and results[1].text == results[4].text
    pieces = [ev for ev in seen if isinstance(ev, TranscriptPiece) and ev.job_id == 1]
    assert "".join(p.text for p in pieces) == results[1].text
    # one token per engine step: no step carries two pieces of one job
    for step in run.steps:
        ones = [ev for ev in step if isinstance(ev, TranscriptPiece) and ev.job_id == 1]
        assert len(ones) <= 1

"""Audio through the loaded chat model, against a real server: the tiny
Gemma 3n fixture (a random text model with a random conformer audio tower)
transcribes on /v1/audio/transcriptions as upstream's translation layer
does (ASR prompt, real token counts, one delta per token), takes OpenAI
input_audio parts on /v1/chat/completions, and what the clip holds changes
what it says.  One server for the module."""

from __future__ import annotations

import base64
import io
import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import soundfile as sf

pytestmark = pytest.mark.e2e

ROUTE = "/v1/audio/transcriptions"


def _tone(hz: float, seconds: float = 6.0, fmt: str = "WAV") -> bytes:
    """A sine clip; two pitches far apart give the random tower different features."""
    rate = 16000
    t = np.arange(int(rate * seconds)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32), rate, format=fmt)
    return buf.getvalue()


LOW, HIGH = _tone(300), _tone(3000)


@pytest.fixture(scope="module")
def gemma(start_server):
    pytest.importorskip("mlx_vlm")
    from fixtures.build import ensure

    srv = start_server(ensure("tiny-gemma3n"), "-c", "2048", "-np", "3", "--no-warmup")
    yield srv
    srv.stop()


def _transcribe(srv, clip: bytes, **data) -> httpx.Response:
    return httpx.post(srv.url + ROUTE, files={"file": ("a.wav", clip)},
                      data={"max_tokens": "8", **data}, timeout=120)


def _chat(srv, content, **extra) -> httpx.Response:
    return httpx.post(srv.url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": content}], "max_tokens": 8,
        "temperature": 0, **extra})


def _audio_part(clip: bytes, fmt: str = "wav") -> dict:
    return {"type": "input_audio",
            "input_audio": {"data": base64.b64encode(clip).decode(), "format": fmt}}


def test_transcription_runs_through_the_chat_model(gemma):
    props = httpx.get(gemma.url + "/props").json()
    assert props["modalities"] == {"vision": False, "video": False, "audio": True}
    first = _transcribe(gemma, LOW)
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["type"] == "transcript.text.done" and body["text"]
    usage = body["usage"]
    # the prompt holds the clip's 188 soft tokens, so it is counted in full
    assert usage["input_tokens"] > 188 and usage["output_tokens"] == 8
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["type"] == "tokens" and usage["input_tokens_details"] == {"cached_tokens": 0}
    assert _transcribe(gemma, LOW).json()["text"] == body["text"], "greedy is deterministic"
    assert _transcribe(gemma, HIGH).json()["text"] != body["text"], \
        "two different clips gave the same greedy transcript"
    # the same sound as FLAC: decoded from its bytes, the same transcript
    assert _transcribe(gemma, _tone(300, fmt="FLAC")).json()["text"] == body["text"]
    # `language` is appended to the ASR prompt: more prompt tokens, another reading
    other = _transcribe(gemma, LOW, language="en").json()["usage"]
    assert other["input_tokens"] > usage["input_tokens"]
    # a clip over 30 s is heard in 30-second pieces, each its own run of soft tokens
    long = _transcribe(gemma, _tone(300, seconds=31.0)).json()["usage"]
    assert long["input_tokens"] == usage["input_tokens"] + 188 + 2


def test_a_streamed_transcript_is_one_delta_per_token_then_done(gemma):
    whole = _transcribe(gemma, HIGH).json()
    with httpx.stream("POST", gemma.url + ROUTE, files={"file": ("a.wav", HIGH)},
                      data={"max_tokens": "8", "stream": "true"}, timeout=120) as r:
        assert r.status_code == 200
        frames = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    events = [json.loads(f) for f in frames[:-1]]
    deltas = [e["delta"] for e in events if e["type"] == "transcript.text.delta"]
    assert events[-1] == whole
    assert 1 <= len(deltas) <= 8 and len(deltas) == len(events) - 1
    assert "".join(deltas) == whole["text"]


def test_chat_input_audio_is_heard(gemma):
    ask = [{"type": "text", "text": "What do you hear?"}]
    plain = _chat(gemma, ask)
    low, high = _chat(gemma, [_audio_part(LOW), *ask]), _chat(gemma, [_audio_part(HIGH), *ask])
    for r in (plain, low, high):
        assert r.status_code == 200, r.text
    texts = [r.json()["choices"][0]["message"]["content"] for r in (plain, low, high)]
    assert len(set(texts)) == 3, f"the clip did not change the reply: {texts}"
    assert low.json()["usage"]["prompt_tokens"] > plain.json()["usage"]["prompt_tokens"] + 188
    # `url` in place of `data` is upstream's other spelling
    part = {"type": "input_audio",
            "input_audio": {"url": "data:audio/wav;base64," + base64.b64encode(LOW).decode()}}
    assert _chat(gemma, [part, *ask]).json()["choices"][0]["message"]["content"] == texts[1]
    # /completion's multimodal_data on the same rendered prompt hears the same clip
    marker = httpx.get(gemma.url + "/props").json()["media_marker"]
    rendered = httpx.post(gemma.url + "/apply-template", timeout=60, json={
        "messages": [{"role": "user", "content": [_audio_part(LOW), *ask]}]}).json()["prompt"]
    native = httpx.post(gemma.url + "/completion", timeout=120, json={
        "prompt": {"prompt_string": re.sub(r"<__media_[0-9a-f]+__>", marker, rendered),
                   "multimodal_data": [base64.b64encode(LOW).decode()]},
        "n_predict": 8, "temperature": 0})
    assert native.status_code == 200, native.text
    assert native.json()["content"] == texts[1]


def test_audio_batched_beside_text_gets_its_solo_result(gemma):
    def text(i: int) -> str:
        r = _chat(gemma, f"Tell me about item {i}.")
        return r.json()["choices"][0]["message"]["content"]

    def heard() -> str:
        return _transcribe(gemma, LOW).json()["text"]

    solo = [heard(), text(1), text(2)]
    with ThreadPoolExecutor(3) as pool:
        together = [f.result() for f in [pool.submit(heard), pool.submit(text, 1),
                                         pool.submit(text, 2)]]
    assert together == solo


def test_bad_audio_is_a_400_and_an_image_a_precise_501(gemma):
    r = _transcribe(gemma, b"RIFF\x10\x00\x00\x00WAVEjunkjunk")
    assert r.status_code == 400 and "audio file is malformed" in r.json()["error"]["message"]
    r = _transcribe(gemma, b"OggS" + bytes(64))
    assert r.status_code == 400 and r.json()["error"]["message"].startswith(
        "unsupported audio format")
    r = _chat(gemma, [_audio_part(b"not audio at all")])
    assert r.status_code == 400 and r.json()["error"]["message"].startswith(
        "unsupported audio format")
    r = _chat(gemma, [{"type": "input_audio", "input_audio": {"format": "wav"}}])
    assert r.status_code == 400
    r = _chat(gemma, [{"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/x.png"}}])
    assert r.status_code == 501
    assert r.json()["error"]["message"].startswith("image input is not supported - hint: ")
    assert "takes audio; its image tower is not loaded" in r.json()["error"]["message"]


def test_a_text_only_checkpoint_refuses_input_audio_with_501(server):
    # the session's text-only tiny server: refused before the clip is read
    r = _chat(server, [{"type": "input_audio", "input_audio": {"data": "!!", "format": "wav"}}])
    assert r.status_code == 501, r.text
    err = r.json()["error"]
    assert err["type"] == "not_supported_error"
    assert err["message"].startswith("audio input is not supported - hint: the loaded "
                                     "checkpoint '") and "has no audio tower" in err["message"]


def test_no_mmproj_turns_audio_off(start_server):
    pytest.importorskip("mlx_vlm")
    from fixtures.build import ensure

    srv = start_server(ensure("tiny-gemma3n"), "-c", "1024", "-np", "1", "--no-mmproj",
                       "--no-warmup")
    assert httpx.get(srv.url + "/props").json()["modalities"]["audio"] is False
    r = _chat(srv, [_audio_part(LOW)])
    assert r.status_code == 501 and r.json()["error"]["message"].startswith(
        "audio input is not supported - hint: the server was started with --no-mmproj")
    r = _transcribe(srv, LOW)
    assert r.status_code == 501
    assert r.json()["error"]["message"] == "The current model does not support audio input."
    srv.stop()

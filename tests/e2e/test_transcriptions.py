"""POST /v1/audio/transcriptions against a real server whose -m is the tiny
Whisper fixture: transcripts, streaming, the OpenAI SDK, upstream's form
errors, the clip's bounds, and a server with no chat model.  One server
for the module."""

from __future__ import annotations

import io
import json
import time

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf


ROUTE = "/v1/audio/transcriptions"


def _clip(fmt: str, seconds: float = 2.0, rate: int = 22050) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate, format=fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def whisper_server(start_server):
    from fixtures.build import ensure

    srv = start_server(ensure("tiny-whisper"), "--no-warmup")
    yield srv
    srv.stop()


def _post(srv, files=None, data=None, **kw) -> httpx.Response:
    return httpx.post(srv.url + ROUTE, files=files, data=data, timeout=120, **kw)


def _error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    body = r.json()["error"]
    assert body["code"] == status
    return body["message"]


def test_a_clip_is_transcribed_the_same_way_twice_and_its_stream_spells_it(whisper_server):
    wav = _clip("WAV")
    first = _post(whisper_server, files={"file": ("a.wav", wav)}, data={"model": "whisper-1"})
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["type"] == "transcript.text.done" and body["text"]
    assert body["usage"] == {"type": "tokens", "input_tokens": 0,
                             "output_tokens": body["usage"]["output_tokens"],
                             "total_tokens": body["usage"]["output_tokens"],
                             "input_tokens_details": {"cached_tokens": 0}}
    assert _post(whisper_server, files={"file": ("a.wav", wav)}).json() == body
    # the same sound as FLAC, named .mp3: the container comes from the bytes
    flac = _clip("FLAC")
    plain = _post(whisper_server, files={"file": ("clip.mp3", flac)}).json()
    streamed = _post(whisper_server, files={"file": ("clip.mp3", flac)},
                     data={"stream": "true"})
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = [ln[len("data: "):] for ln in streamed.text.split("\n") if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    frames = [json.loads(e) for e in events[:-1]]
    deltas = [f["delta"] for f in frames[:-1]]
    assert all(f["type"] == "transcript.text.delta" for f in frames[:-1]) and len(deltas) > 1
    assert frames[-1] == plain and "".join(deltas) == plain["text"]
    # "True" is not the literal "true": no stream
    assert _post(whisper_server, files={"file": ("a.wav", wav)},
                 data={"stream": "True"}).json() == body


def test_the_openai_sdk_reads_the_transcript(whisper_server):
    wav = _clip("WAV")
    want = _post(whisper_server, files={"file": ("a.wav", wav)}).json()["text"]
    with openai.OpenAI(base_url=whisper_server.url + "/v1", api_key="x", max_retries=0,
                       timeout=120) as client:
        got = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", wav))
    assert got.text == want


def test_form_and_clip_errors_use_upstreams_wording(whisper_server):
    wav = _clip("WAV", seconds=0.5)
    assert _error(_post(whisper_server, data={"model": "whisper-1"}), 400) == \
        "No input file found for transcription"
    # upstream's order: the file first, then response_format
    assert _error(_post(whisper_server, data={"response_format": "text"}), 400) == \
        "No input file found for transcription"
    assert _error(_post(whisper_server, files={"file": ("a.wav", wav)},
                        data={"response_format": "verbose_json"}), 400) == \
        "Only 'json' response_format is supported for transcription"
    assert _error(_post(whisper_server, files={"file": ("a.wav", wav)},
                        data={"temperature": "warm"}), 400) == \
        "Invalid 'temperature': expected a number, got 'warm'"
    assert _error(_post(whisper_server, files={"file": ("a.ogg", b"OggS" + bytes(200))}), 400) \
        == "unsupported audio format: the file is not WAV, MP3 or FLAC (identified from its " \
           "content)"
    assert _error(_post(whisper_server, files={"file": ("a.wav", wav[:40])}), 400).startswith(
        "audio file is malformed or truncated (WAV)")
    assert _error(_post(whisper_server, files={"file": ("a.wav", wav)},
                        data={"language": "xx"}), 400) == \
        "language 'xx' is not one this model transcribes"
    # a repeated text field is ignored, as upstream's array is: json applies
    parts = [("file", ("a.wav", wav)), ("response_format", (None, "text")),
             ("response_format", (None, "srt"))]
    r = httpx.post(whisper_server.url + ROUTE, files=parts, timeout=120)
    assert r.status_code == 200 and r.json()["type"] == "transcript.text.done"


def test_a_body_over_the_limit_is_refused_from_its_length(whisper_server):
    big = bytes(26 * 1024 * 1024 + 1024 * 1024 + 1)
    r = _post(whisper_server, files={"file": ("a.wav", big)})
    assert "the limit is 27262976 bytes" in _error(r, 413)


def test_a_chunked_upload_is_cut_once_it_passes_the_limit(whisper_server):
    """No Content-Length to refuse from: the server stops reading once the
    body passes one clip's limit and answers 413, long before the 60 MiB
    this client would send (the general body limit is 64 MiB)."""
    import select
    import socket
    from urllib.parse import urlsplit

    u = urlsplit(whisper_server.url)
    head = (f"POST {ROUTE} HTTP/1.1\r\nHost: {u.hostname}\r\nTransfer-Encoding: chunked\r\n"
            "Content-Type: multipart/form-data; boundary=XyZ\r\n\r\n").encode()
    part = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n"
    chunk = b"%x\r\n" % (1 << 20) + bytes(1 << 20) + b"\r\n"
    sent, reply = 0, b""
    with socket.create_connection((u.hostname, u.port), timeout=60) as sock:
        sock.sendall(head + b"%x\r\n" % len(part) + part + b"\r\n")
        pending = memoryview(b"".join([chunk] * 60))
        deadline = time.monotonic() + 60
        while not reply and time.monotonic() < deadline:
            readable, writable, _ = select.select([sock], [sock] if pending else [], [], 1)
            if readable:
                reply = sock.recv(65536)
            elif writable:
                n = sock.send(pending[:1 << 16])
                sent, pending = sent + n, pending[n:]
        while reply and (more := sock.recv(65536)):  # the rest, to the server's close
            reply += more
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert b"the limit is 27262976 bytes" in reply
    assert sent < 40 * (1 << 20), sent


def test_a_whisper_server_serves_no_chat_and_says_it_takes_audio(whisper_server):
    r = httpx.post(whisper_server.url + "/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": "hi"}]})
    assert _error(r, 501).startswith("This server does not support completions")
    assert httpx.get(whisper_server.url + "/props").json()["modalities"] == \
        {"vision": False, "video": False, "audio": True}
    models = httpx.get(whisper_server.url + "/v1/models").json()
    assert models["models"][0]["capabilities"] == ["transcription"]


def test_whisper_with_an_encoder_flag_fails_at_startup(start_server):
    from fixtures.build import ensure

    srv = start_server(ensure("tiny-whisper"), "--embeddings", wait_ready=False)
    assert srv.wait(60) != 0
    assert "--embeddings needs a chat or encoder model" in srv.drain()

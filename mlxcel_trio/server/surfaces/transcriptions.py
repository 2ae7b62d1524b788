"""POST /v1/audio/transcriptions and /audio/transcriptions: a multipart form
in, a transcript event out (or a stream of them).

Two servers answer it.  When the loaded chat model takes audio (a Gemma 3n
checkpoint), the route is upstream's translation layer: the clip and an ASR
prompt ("Transcribe audio to text", or the `prompt` field, with
" (language: xx)" appended for a non-empty `language`) become one user
message, generated as a chat completion, and the reply is rendered as the
transcript event with the real token counts.  When -m is a Whisper
checkpoint, the dedicated transcriber answers (engine/stt/).

Upstream's order and wording, each step before the next:
1. capability: without a speech-to-text model the route answers upstream's
   501 "The current model does not support audio input." before the body
   is read, so a request wrong in two ways gets the 501;
2. the form: a part with a filename is a file, any other part a text field;
   a repeated text field becomes an array, which upstream's typed reads
   then ignore (the default applies); a repeated file keeps the last one;
   unknown fields are ignored; no part named `file` is "No input file found
   for transcription" (400);
3. `response_format` defaults to json, anything else is "Only 'json'
   response_format is supported for transcription" (400); `max_tokens`
   and `temperature` arrive as strings and are read as std::stoul and
   std::stof read them (leading space and sign, trailing junk ignored),
   a value with no number in front is a 400; `stream` is on only when it is
   the literal "true";
4. the clip: decoded by media/audio.py (WAV, MP3 or FLAC by content, within
   its bounds), else a 400 naming the problem.

Bounds before anything is parsed: the body (media/limits.UPLOAD_BODY_BYTES,
one 25 MiB clip and room for the text fields, held by http/body_limits.py),
at most `MAX_PARTS` parts, at most `MAX_PART_BYTES` per part.  The answer
is upstream's transcript-event object, {"type": "transcript.text.done",
"text", "usage"}; with stream=true one transcript.text.delta frame per
decoded token (a token that ends inside a UTF-8 character waits for the
next), then the done frame, then data: [DONE].
"""

from __future__ import annotations

import math
import re

from quart import Response, request

from ...media import audio
from ...protocol.records import (Failed, Finished, TokenPiece, TranscribeJob, Transcribed,
                                 TranscriptPiece)
from ..http.errors import ApiError, engine_failure, error_response, json_response
from ..http.sse import DONE, frame
from ..request.served import Served, off_loop
from ..request.media_input import audio_of
from .streaming import stream_jobs

ASR_PROMPT = "Transcribe audio to text"  # upstream's ASR preset (common_chat_get_asr_prompt)

MAX_PARTS = 32
MAX_PART_BYTES = audio.MAX_FILE_BYTES
_REPEATED = object()  # a text field given more than once (upstream: an array)
# std::stoul / std::stof: leading whitespace, a sign, then the number; the rest ignored
_ULONG = re.compile(r"\s*([+-]?)(\d+)")
_FLOAT = re.compile(r"\s*([+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan))",
                    re.IGNORECASE)


def no_audio_model() -> Response:
    return error_response(engine_failure("no_audio_model"))


def no_chat_model() -> Response:
    """What a generation route answers on a server whose -m is a Whisper
    checkpoint: 501, as on an --embeddings server (there is no chat model)."""
    return error_response(ApiError("This server does not support completions: it serves a "
                                   "speech-to-text model (/v1/audio/transcriptions)",
                                   "not_supported_error"))


def _bad(message: str) -> ApiError:
    return ApiError(message, "invalid_request_error")


def parse_form(raw: bytes, content_type: str) -> tuple[dict, dict[str, bytes]]:
    """(text fields, files) of a multipart/form-data body, within the part
    bounds; a repeated text field maps to `_REPEATED`."""
    from werkzeug.http import parse_options_header
    from werkzeug.sansio.multipart import Data, Epilogue, Field, File, MultipartDecoder, NeedData

    mime, options = parse_options_header(content_type)
    boundary = options.get("boundary", "")
    if mime != "multipart/form-data" or not boundary:
        return {}, {}  # no form: no file either (upstream reads no parts)
    decoder = MultipartDecoder(boundary.encode("latin-1", "replace"))
    fields: dict = {}
    files: dict[str, bytes] = {}
    try:
        decoder.receive_data(raw)
        decoder.receive_data(None)
        n_parts = 0
        part, chunks, size = None, [], 0
        while True:
            event = decoder.next_event()
            if isinstance(event, Epilogue):
                break
            if isinstance(event, NeedData):
                raise _bad("malformed multipart body: it ends inside a part")
            if isinstance(event, (Field, File)):
                n_parts += 1
                if n_parts > MAX_PARTS:
                    raise _bad(f"multipart body has more than {MAX_PARTS} parts")
                part, chunks, size = event, [], 0
            elif isinstance(event, Data) and part is not None:
                size += len(event.data)
                if size > MAX_PART_BYTES:
                    raise ApiError(f"multipart part '{part.name}' is larger than "
                                   f"{MAX_PART_BYTES} bytes", "invalid_request_error",
                                   status=413)
                chunks.append(event.data)
                if not event.more_data:
                    value = b"".join(chunks)
                    if isinstance(part, File):
                        files[part.name] = value   # a repeated file: the last one
                    else:
                        text = value.decode("utf-8", "replace")
                        fields[part.name] = _REPEATED if part.name in fields else text
                    part = None
    except ValueError as exc:
        raise _bad(f"malformed multipart body: {exc}") from None
    return fields, files


def form_text(fields: dict, name: str, default: str) -> str:
    value = fields.get(name, default)
    return default if value is _REPEATED else value


def form_max_tokens(fields: dict) -> int | None:
    raw = fields.get("max_tokens")
    if raw is None or raw is _REPEATED:
        return None
    m = _ULONG.match(raw)
    if m is None:
        raise _bad(f"Invalid 'max_tokens': expected an unsigned integer, got '{raw}'")
    # std::stoul wraps a negative value to a huge one: no cap
    return None if m.group(1) == "-" and int(m.group(2)) else int(m.group(2))


def form_temperature(fields: dict) -> float:
    raw = fields.get("temperature")
    if raw is None or raw is _REPEATED:
        return 0.0
    m = _FLOAT.match(raw)
    if m is None:
        raise _bad(f"Invalid 'temperature': expected a number, got '{raw}'")
    value = float(m.group(1))
    if not math.isfinite(value):
        raise _bad(f"Invalid 'temperature': expected a finite number, got '{raw}'")
    return max(0.0, value)


async def transcribe(served: Served) -> Response:
    bridge = served.bridge
    through_chat = bridge.info.transcriber is None and audio_of(served) is not None
    if bridge.info.transcriber is None and not through_chat:
        return no_audio_model()
    # held to UPLOAD_BODY_BYTES by the request class (http/body_limits.py): a
    # larger one is a 413 from its Content-Length or as soon as it passes it
    raw = await request.get_data()
    fields, files = await off_loop(served, parse_form, raw,
                                   request.headers.get("Content-Type", ""))
    clip = files.get("file")
    if clip is None:
        raise _bad("No input file found for transcription")
    if form_text(fields, "response_format", "json") != "json":
        raise _bad("Only 'json' response_format is supported for transcription")
    stream = form_text(fields, "stream", "false") == "true"
    max_tokens = form_max_tokens(fields)
    temperature = form_temperature(fields)
    if through_chat:
        return await _through_chat(served, clip, fields, stream, max_tokens, temperature)
    try:
        samples = await off_loop(served, audio.decode, clip)
    except audio.AudioError as exc:
        raise _bad(str(exc)) from None
    job = TranscribeJob(bridge.next_job_id(), samples,
                        language=form_text(fields, "language", "") or None,
                        prompt=form_text(fields, "prompt", "") or None,
                        temperature=temperature, max_tokens=max_tokens)
    if stream:
        return await stream_jobs(served, [job], _render, served.defaults.sse_ping_interval,
                                 trailer=DONE)
    async with bridge.submit(job) as events:
        async for ev in events:
            if isinstance(ev, Failed):
                raise ApiError.from_failed(ev)
            if isinstance(ev, Transcribed):
                return json_response(done_event(ev))
    raise ApiError("transcription ended without a result", "server_error")


def done_event(ev: Transcribed) -> dict:
    """Upstream's transcript.text.done object.  The audio is not counted as
    input tokens (a Whisper encoder takes Mel frames, not tokens)."""
    return {"type": "transcript.text.done", "text": ev.text,
            "usage": {"type": "tokens", "input_tokens": 0, "output_tokens": ev.n_tokens,
                      "total_tokens": ev.n_tokens,
                      "input_tokens_details": {"cached_tokens": 0}}}


async def _through_chat(served: Served, clip: bytes, fields: dict, stream: bool,
                        max_tokens: int | None, temperature: float) -> Response:
    """Upstream's transcription: the clip and the ASR prompt as one user
    message to the loaded chat model, its reply as the transcript event."""
    from ..request.jobs import resolve, run_all
    from ..request.media_input import decode_audio, new_marker
    from .openai_chat import chat_jobs, final_message, plan_with_media

    prompt = form_text(fields, "prompt", "") or ASR_PROMPT
    language = form_text(fields, "language", "")
    if language:
        prompt += f" (language: {language})"
    marker = new_marker()
    body: dict = {"messages": [{"role": "user", "content": prompt + marker}],
                  "stream": stream, "temperature": temperature}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    pieces = await off_loop(served, decode_audio, clip)
    chat = await plan_with_media(served, body, [pieces], marker)
    values = resolve(chat.native, served)
    jobs = chat_jobs(served, None, chat, values)

    def done(fin: Finished) -> dict:
        n_out = len(fin.tokens)
        return {"type": "transcript.text.done", "text": final_message(chat, fin.content).content,
                "usage": {"type": "tokens", "input_tokens": fin.n_prompt, "output_tokens": n_out,
                          "total_tokens": fin.n_prompt + n_out,
                          "input_tokens_details": {"cached_tokens": fin.timings.cache_n}}}

    if not stream:
        (fin,) = await run_all(served, jobs)
        return json_response(done(fin))

    def render(ev):
        if isinstance(ev, TokenPiece) and ev.text:
            yield frame({"type": "transcript.text.delta", "delta": ev.text})
        elif isinstance(ev, Finished):
            yield frame(done(ev))

    return await stream_jobs(served, jobs, render, values.sse_ping_interval, trailer=DONE)


def _render(ev):
    if isinstance(ev, TranscriptPiece):
        yield frame({"type": "transcript.text.delta", "delta": ev.text})
    elif isinstance(ev, Transcribed):
        yield frame(done_event(ev))

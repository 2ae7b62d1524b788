"""Images in requests: the capability gate, the URL-to-bytes step, the
decode, and the placement of each image's placeholder tokens.

The gate runs first, on the request's shape alone: a checkpoint without an
image tower (or a server started with --no-mmproj) refuses an image part
with upstream's leading clause before any URL is read.  `image_bytes` is
the one place a URL becomes bytes (the media room's confined, SSRF-guarded
reader, under the app's `MediaPolicy`).  Chat routes render each image as a
per-request marker string in the text (as upstream's media marker), so a
client can never forge a placeholder; the rendered prompt is then split on
the marker and each image's run of placeholder ids goes in its place.
"""

from __future__ import annotations

import hashlib
import secrets
from contextlib import contextmanager
from typing import Any, Sequence

from ...media import MediaError, MediaPolicy, read_media
from ...media import decode_image as decode_bounded
from ...media.data_url import decode_base64 as decode_base64_within
from ...protocol.records import AudioInfo, AudioInput, ImageInput, VisionInfo
from ..http.errors import ApiError, engine_failure
from .served import off_loop

# content part types that carry media, and the kind upstream's refusal names
MEDIA_PARTS = {"image_url": "image", "input_audio": "audio", "input_video": "video"}


class MediaPrompt(list):
    """A prompt's token ids with the images (`images`) and audio clips
    (`audio`) placed in it."""

    images: tuple[ImageInput, ...] = ()
    audio: tuple[AudioInput, ...] = ()


def vision_of(served) -> VisionInfo | None:
    """The image input the server takes: None without an image tower or
    under --no-mmproj."""
    return _tower(served, "vision")


def audio_of(served) -> AudioInfo | None:
    """The audio input the chat model takes: None without an audio tower or
    under --no-mmproj."""
    return _tower(served, "audio")


def _tower(served, kind: str):
    info = served.bridge.info
    if info is None or not served.state.config.mmproj_auto:
        return None
    return getattr(info, kind)


def refusal(kind: str, served) -> ApiError:
    """Upstream's `<kind> input is not supported` clause at 501, its hint
    replaced: there is no projector file to provide for an MLX checkpoint."""
    name = served.model_name
    if not served.state.config.mmproj_auto:
        hint = "the server was started with --no-mmproj, which refuses media input"
    elif kind == "image" and audio_of(served) is not None:
        hint = (f"the loaded checkpoint '{name}' takes audio; its image tower is not "
                "loaded by this server")
    elif kind == "image":
        hint = (f"the loaded checkpoint '{name}' has no image tower; serve an MLX "
                "vision-language checkpoint (language model, vision tower and projector in "
                "one snapshot) with -m to accept images")
    else:
        hint = f"the loaded checkpoint '{name}' has no {kind} tower"
    return ApiError(f"{kind} input is not supported - hint: {hint}", "not_supported_error")


def media_parts(body: Any):
    """(message index, part index, kind) of every media part of a chat body."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return
    for i, msg in enumerate(messages):
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list):
            for j, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") in MEDIA_PARTS:
                    yield i, j, MEDIA_PARTS[part["type"]]


@contextmanager
def _answered():
    """A media refusal as the API error the client is answered."""
    try:
        yield
    except MediaError as exc:
        raise ApiError(exc.message, exc.type, status=exc.status) from None


async def image_bytes(url: str, policy: MediaPolicy) -> bytes:
    """The bytes a request's image URL names, through the media room:
    data: and bare base64 decoded, http(s) fetched behind the SSRF guard,
    file:// read inside --media-path, each within the payload bound."""
    with _answered():
        return await read_media(url, policy)


def decode_base64(data: str, policy: MediaPolicy) -> bytes:
    """A native multimodal_data item (raw base64), within the payload bound."""
    with _answered():
        return decode_base64_within(data, policy.max_bytes)


def check_count(count: int, policy: MediaPolicy) -> None:
    """--max-images, before any item is read."""
    with _answered():
        policy.check_count(count)


def decode_image(data: bytes, start: int = 0) -> ImageInput:
    """RGB pixels of an encoded image, within the decoder's size caps."""
    with _answered():
        rgb = decode_bounded(data)
    raw = rgb.tobytes()
    digest = hashlib.sha256(f"{rgb.width}x{rgb.height}:".encode() + raw).hexdigest()
    return ImageInput(raw, rgb.width, rgb.height, digest, start)


def new_marker() -> str:
    """A per-request media marker (a client cannot forge it)."""
    return f"<__media_{secrets.token_hex(8)}__>"


CLIP_SAMPLES = 30 * 16_000  # what one run of soft tokens hears (the front end's window)


def decode_audio(data: bytes) -> tuple[AudioInput, ...]:
    """16 kHz mono samples of a WAV, MP3 or FLAC clip (media/audio.py's
    bounds), in 30-second pieces, each of which gets its own run of soft
    tokens (the audio tower hears 30 s at a time); a clip that cannot be
    used is a 400 naming the problem."""
    from ...media import audio

    try:
        samples = audio.decode(data)
    except audio.AudioError as exc:
        raise ApiError(str(exc)) from None
    pieces = []
    for at in range(0, len(samples), CLIP_SAMPLES):
        raw = samples[at:at + CLIP_SAMPLES].astype("<f4").tobytes()
        pieces.append(AudioInput(raw, hashlib.sha256(b"audio:" + raw).hexdigest(), 0))
    return tuple(pieces)


def _taken(kind: str, served) -> bool:
    return (vision_of(served) if kind == "image" else
            audio_of(served) if kind == "audio" else None) is not None


async def chat_images(body: Any, served) -> tuple[Any, list, str]:
    """The chat body with each image or audio part replaced by a marker text
    part, the decoded items (ImageInput / AudioInput) in order, and the
    marker.  Refuses (501) before reading anything when the server does not
    take a part's kind."""
    found = list(media_parts(body))
    if not found:
        return body, [], ""
    for _, _, kind in found:
        if not _taken(kind, served):
            raise refusal(kind, served)
    check_count(len(found), served.state.media)
    marker = new_marker()
    messages = [dict(m) if isinstance(m, dict) else m for m in body["messages"]]
    images = []
    for i, j, kind in found:
        part = messages[i]["content"][j]
        if kind == "audio":
            # upstream reads input_audio.data, else input_audio.url; `format`
            # is not needed (the container is identified from the bytes)
            spec = part.get("input_audio")
            url = (spec.get("data", spec.get("url")) if isinstance(spec, dict) else None)
            if not isinstance(url, str) or not url:
                raise ApiError("input_audio must contain a 'data' string")
            decode = decode_audio
        else:
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if not isinstance(url, str):
                raise ApiError("image_url must contain a 'url' string")
            decode = decode_image
        data = await image_bytes(url, served.state.media)
        images.append(await off_loop(served, decode, data))
        content = list(messages[i]["content"])
        content[j] = {"type": "text", "text": marker}
        messages[i]["content"] = content
    return {**body, "messages": messages}, images, marker


def place(text: str, marker: str, images: Sequence, vision: VisionInfo | None,
          tokenize, add_special: bool, audio: AudioInfo | None = None) -> MediaPrompt:
    """`text` split on `marker`: each piece tokenized, each marker replaced
    by its item's placeholder run (an image's size decides its run on a
    dynamic-resolution family; `images` holds ImageInput items and, for
    audio, tuples of AudioInput pieces).  A clip's run is the Gemma 3n
    processor's: a blank line, then per 30-second piece the begin-audio
    token, its soft tokens and the end-audio token, then a blank line.
    A marker count that differs from the item count is upstream's tokenize
    failure."""
    pieces = text.split(marker)
    if len(pieces) - 1 != len(images):
        raise engine_failure("untokenizable")
    clip_at = [isinstance(im, tuple) for im in images]
    out = MediaPrompt()
    placed, clips = [], []
    for k, piece in enumerate(pieces):
        if k > 0 and clip_at[k - 1]:
            piece = "\n\n" + piece
        if k < len(images) and clip_at[k]:
            piece = piece + "\n\n"
        if piece:
            out.extend(tokenize(piece, add_special and k == 0))
        elif k == 0 and add_special:
            out.extend(tokenize("", True))
        if k < len(images):
            im = images[k]
            if clip_at[k]:
                if audio is None:
                    raise engine_failure("untokenizable")
                for piece_of_clip in im:
                    out.append(audio.begin_token)
                    clips.append(AudioInput(piece_of_clip.samples, piece_of_clip.digest,
                                            len(out)))
                    out.extend([audio.audio_token] * audio.tokens_per_clip)
                    out.append(audio.end_token)
                continue
            if vision is None:
                raise engine_failure("untokenizable")
            placed.append(ImageInput(im.rgb, im.width, im.height, im.digest, len(out)))
            out.extend(vision.layout(im.width, im.height))
    out.images = tuple(placed)
    out.audio = tuple(clips)
    return out

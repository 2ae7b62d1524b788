"""The byte budgets of media inputs, and the JSON body ceiling they imply.

A chat, responses or Anthropic body may hold --max-images base64 items of
up to --max-image-payload-size bytes each: base64 grows them by 4/3, and
the JSON around them (the text, the data-URL prefixes) takes a little
more.  The ceiling never drops below the general body limit, so a small
image budget does not shrink what a text-only request may send, and is
clamped at 2 GiB so no setting makes buffered JSON parsing unbounded.
Per-item limits are enforced exactly after parsing (read_media).
"""

from __future__ import annotations

DEFAULT_MAX_PAYLOAD = 20 * 1024 * 1024  # bytes per media item (--max-image-payload-size)
DEFAULT_MAX_IMAGES = 16                 # media items per request (--max-images)
JSON_OVERHEAD = 1024 * 1024             # the request's text and the data-URL prefixes
CLAMP = 2 * 1024 * 1024 * 1024          # 2 GiB
AUDIO_FILE_BYTES = 25 * 1024 * 1024     # one uploaded or inline audio clip
# a multipart transcription upload: one clip and room for its text fields
UPLOAD_BODY_BYTES = AUDIO_FILE_BYTES + JSON_OVERHEAD


def body_limit(max_image_payload: int, max_images: int, floor: int = 0) -> int:
    """ceil(payload * images * 4/3) + overhead, at least `floor`, at most 2 GiB."""
    encoded = -(-max(0, max_image_payload) * max(0, max_images) * 4 // 3)
    return min(CLAMP, max(floor, encoded + JSON_OVERHEAD))

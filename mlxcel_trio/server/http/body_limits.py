"""Which body size limit a request is held to, decided from its path.

Most routes keep the general limit (MAX_BODY_BYTES in http/app_shell.py).  A route
whose body may carry base64 media inline (`Route.media`: chat completions,
responses, Anthropic messages and their token counters) gets the ceiling
derived from the image budget (media/limits.py: --max-image-payload-size
times --max-images, grown by base64's 4/3 and a little JSON overhead,
never below the general limit, clamped at 2 GiB).  A multipart audio
upload (`Route.upload`: the transcription routes) is held to one clip's
size and its text fields (media/limits.UPLOAD_BODY_BYTES), below the
general limit, so a chunked upload is cut as soon as it passes that.  A
body past its limit is refused from its Content-Length, or as soon as the
bytes read pass it, before anything is parsed: OpenAI's 413 shape
(errors.payload_too_large), naming the limit that applied.

Quart fixes a request's limit when the request object is built, so the
choice is made there: the app's request class looks the path up.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from quart_trio.wrappers import TrioRequest

from ...media.limits import UPLOAD_BODY_BYTES, body_limit
from ...protocol.routes import Route


def media_body_limits(routes: Iterable[Route], prefix: str, max_image_payload: int,
                      max_images: int, general: int) -> dict[str, int]:
    """The full path -> limit of every media-carrying or upload route."""
    limit = body_limit(max_image_payload, max_images, floor=general)
    return {prefix + r.path: limit if r.media else UPLOAD_BODY_BYTES
            for r in routes if r.media or r.upload}


def sized_request_class(limits: Mapping[str, int]) -> type[TrioRequest]:
    """A request class holding each path in `limits` to its own body limit
    (every other path keeps the app's MAX_CONTENT_LENGTH)."""
    table = dict(limits)

    class SizedRequest(TrioRequest):
        def __init__(self, method, scheme, path, *args, max_content_length=None, **kwargs):
            limit = table.get(path, max_content_length)
            super().__init__(method, scheme, path, *args, max_content_length=limit, **kwargs)
            self.max_content_length = limit  # what the 413 names

    return SizedRequest

"""Media inputs (images, audio, video): reading a reference into bounded
bytes, and decoding images within bounds.  Pure: no server, engine or MLX
imports; async entry points run under trio (or asyncio) through anyio.

Public API:

``MediaPolicy(media_path=None, max_bytes=20 MiB, max_items=16,
allow_private=False, timeout=10.0)``
    What a read may do.  ``MediaPolicy.from_settings(media_path, max_bytes,
    max_items, env)`` builds the server's from --media-path (canonicalized),
    --max-image-payload-size, --max-images and MLXCEL_ALLOW_PRIVATE_MEDIA_URLS
    in `env` (os.environ by default).  ``policy.check_count(n)`` refuses a
    request carrying more than max_items media items (call it before reading).

``await read_media(url, policy) -> bytes``
    The bytes a request's media reference names, at most policy.max_bytes:
    ``http(s)://`` fetched behind the SSRF guard (fetch.py, ssrf.py),
    ``file://`` read inside --media-path (paths.py), ``data:...;base64,``
    and bare base64 decoded (data_url.py); with --media-path set, a bare
    path that is not base64 (``cat.png``) is read like ``file://cat.png``.
    Raises `MediaError`.

``decode_image(data, max_side=16384, max_pixels=64 Mi) -> PIL.Image``
    RGB, with the size caps checked from the header before the pixels are
    decoded.  Raises `MediaError`.

``MediaError(message, status=400, type="invalid_request_error")``
    Every refusal; its `status`, `message` and `type` are the HTTP answer.

``body_limit(max_image_payload, max_images, floor=0) -> int``
    The JSON body ceiling of routes that carry inline media:
    ceil(payload * images * 4/3) + 1 MiB, at least `floor`, at most 2 GiB.

``DEFAULT_MAX_PAYLOAD`` (20 MiB), ``DEFAULT_MAX_IMAGES`` (16)
    The option defaults.

Audio (audio.py, imported by its users directly): a transcription upload's
container identified from its bytes, its geometry bounded from the header,
then decoded and resampled to 16 kHz mono within a frame budget.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .errors import MediaError
from .limits import DEFAULT_MAX_IMAGES, DEFAULT_MAX_PAYLOAD, body_limit
from .policy import MediaPolicy

if TYPE_CHECKING:
    from PIL import Image

# The package is imported by the command line (its defaults): httpx, anyio
# and Pillow are imported on first use, not at startup.

__all__ = ["DEFAULT_MAX_IMAGES", "DEFAULT_MAX_PAYLOAD", "MediaError", "MediaPolicy",
           "body_limit", "decode_image", "read_media"]

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")


async def read_media(url: str, policy: MediaPolicy) -> bytes:
    """The bytes `url` names, within `policy` (see the module docstring)."""
    import anyio

    from . import data_url, fetch, paths

    m = _SCHEME.match(url)
    scheme = m.group(1).lower() if m else ""
    if scheme in ("http", "https"):
        return await fetch.fetch(url, policy)
    if scheme == "file" and url[5:7] == "//":
        reference = url[7:]  # upstream: everything after "file://"
        return await anyio.to_thread.run_sync(paths.read_file, reference, policy.media_path,
                                              policy.max_bytes)
    # base64 of up to --max-image-payload-size: decoded off the event loop
    if scheme == "data":
        return await anyio.to_thread.run_sync(data_url.decode_data_url, url, policy.max_bytes)
    if m and url[m.end():m.end() + 2] == "//":
        raise MediaError(f"{fetch.DOWNLOAD_FAILED}: only http and https URLs are fetched")
    if policy.media_path and not data_url.is_base64(url) and paths.valid_name(url):
        # a bare path under --media-path: what an operator who set it writes
        return await anyio.to_thread.run_sync(paths.read_file, url, policy.media_path,
                                              policy.max_bytes)
    return await anyio.to_thread.run_sync(data_url.decode_base64, url, policy.max_bytes)


def decode_image(data: bytes, max_side: int | None = None,
                 max_pixels: int | None = None) -> "Image.Image":
    """`data` as an RGB image within the size caps (images.py)."""
    from . import images

    return images.decode_image(data, max_side or images.MAX_SIDE,
                               max_pixels or images.MAX_PIXELS)

"""The one error the media room raises.

`MediaError` carries what the HTTP layer answers with: the status, the
message and upstream's error type.  The room itself never imports the
server; a caller turns a `MediaError` into its own error record at one
boundary (e.g. ``ApiError(err.message, err.type, status=err.status)``).
"""

from __future__ import annotations


class MediaError(Exception):
    """A media reference that cannot be read, with the answer to give."""

    def __init__(self, message: str, status: int = 400,
                 type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type


# upstream's sentence for every failed remote fetch (handle_media)
DOWNLOAD_FAILED = "Failed to download image"


def too_large(what: str, limit: int) -> MediaError:
    """A payload past the configured byte budget."""
    return MediaError(f"{what} exceeds the media payload limit of {limit} bytes "
                      "(--max-image-payload-size)")

"""Inline media: ``data:<type>;base64,<payload>`` URLs and bare base64.

Upstream's sentences, at 400 (upstream throws them as runtime errors, which
its boundary answers with 500; the input is the client's, so this answers
the 400 it meant, as the JSON body errors do).  The byte budget is checked
on the encoded length before anything is decoded, so an oversized payload
costs no decode.
"""

from __future__ import annotations

import base64
import binascii
import re

from .errors import MediaError, too_large

_WHITESPACE = re.compile(r"\s+")


_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")


def is_base64(text: str) -> bool:
    """Whether `text` (whitespace aside) is standard base64 of whole quanta."""
    payload = _WHITESPACE.sub("", text)
    return len(payload) % 4 == 0 and _BASE64.fullmatch(payload) is not None


def decode_base64(text: str, max_bytes: int) -> bytes:
    """Standard-alphabet base64 (whitespace ignored, padding optional)."""
    payload = _WHITESPACE.sub("", text)
    if not payload:
        raise MediaError("Invalid base64 value")
    payload += "=" * (-len(payload) % 4)
    if len(payload) // 4 * 3 - payload[-2:].count("=") > max_bytes:
        raise too_large("the inline media", max_bytes)
    try:
        decoded = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError("Invalid base64 value") from None
    if not decoded:
        raise MediaError("Invalid base64 value")
    return decoded


def decode_data_url(url: str, max_bytes: int) -> bytes:
    """The payload of a base64 data: URL (any media type: the decoder that
    reads the bytes decides whether they are an image, audio or video)."""
    parts = url.split(",")
    if len(parts) != 2:
        raise MediaError("Invalid uri-encoded base64 value")
    header, payload = parts
    if not re.fullmatch(r"data:[\w.+-]+/[\w.+-]+(;[^;,]*)*", header, re.ASCII):
        raise MediaError(f"Invalid uri format: {header}")
    if not header.endswith("base64"):
        raise MediaError("uri must be base64 encoded")
    return decode_base64(payload, max_bytes)

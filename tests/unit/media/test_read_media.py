"""read_media's dispatch (file://, data:, bare base64, other schemes) and
the bounded image decoder."""

from __future__ import annotations

import base64
import io
import os
import random

import pytest
from PIL import Image

from mlxcel_trio.media import MediaError, MediaPolicy, body_limit, decode_image, read_media


def png(width: int = 4, height: int = 3, mode: str = "RGBA") -> bytes:
    out = io.BytesIO()
    Image.new(mode, (width, height), (10, 20, 30, 255)[:len(mode)]).save(out, "PNG")
    return out.getvalue()


def noise_png() -> bytes:
    out = io.BytesIO()
    Image.frombytes("RGB", (32, 32), random.Random(0).randbytes(32 * 32 * 3)).save(out, "PNG")
    return out.getvalue()


async def refused(url: str, policy: MediaPolicy | None = None) -> str:
    with pytest.raises(MediaError) as info:
        await read_media(url, policy or MediaPolicy())
    assert info.value.status == 400
    return info.value.message


async def test_data_urls_and_bare_base64():
    data = png()
    encoded = base64.b64encode(data).decode()
    assert await read_media(f"data:image/png;base64,{encoded}", MediaPolicy()) == data
    assert await read_media(f"data:audio/wav;base64,{encoded}", MediaPolicy()) == data
    assert await read_media(encoded, MediaPolicy()) == data
    assert await read_media(encoded.rstrip("="), MediaPolicy()) == data  # padding optional


@pytest.mark.parametrize("url, message", [
    ("data:image/png;base64,AAAA,BBBB", "Invalid uri-encoded base64 value"),
    ("data:image/png;base64", "Invalid uri-encoded base64 value"),
    ("data:nonsense;base64,AAAA", "Invalid uri format: data:nonsense;base64"),
    ("data:image/png,AAAA", "uri must be base64 encoded"),
    ("data:image/png;base64,@@@@", "Invalid base64 value"),
    ("data:image/png;base64,", "Invalid base64 value"),
    ("not base64 at all!", "Invalid base64 value"),
])
async def test_upstreams_sentences_for_bad_inline_media(url, message):
    assert await refused(url) == message


async def test_inline_media_over_the_budget_is_refused_before_decoding():
    encoded = base64.b64encode(b"z" * 1001).decode()
    policy = MediaPolicy(max_bytes=1000)
    assert "exceeds the media payload limit of 1000 bytes" in \
        await refused(f"data:image/png;base64,{encoded}", policy)
    assert await read_media(base64.b64encode(b"z" * 1000).decode(), policy) == b"z" * 1000


async def test_file_urls_go_through_the_media_path(tmp_path):
    (tmp_path / "cat.png").write_bytes(b"cat")
    policy = MediaPolicy(media_path=os.path.realpath(tmp_path))
    assert await read_media("file://cat.png", policy) == b"cat"
    assert await read_media(f"file://{os.path.realpath(tmp_path)}/cat.png", policy) == b"cat"
    assert await refused("file://cat.png") == \
        "file:// URLs are not allowed unless --media-path is specified"


async def test_a_bare_path_reads_under_the_media_path(tmp_path):
    (tmp_path / "cat.png").write_bytes(b"cat")
    policy = MediaPolicy(media_path=os.path.realpath(tmp_path))
    assert await read_media("cat.png", policy) == b"cat"
    assert (await refused("../cat.png", policy)) == "Invalid base64 value"  # not a valid name
    assert (await refused("dog.png", policy)).startswith("file does not exist")
    assert await refused("cat.png") == "Invalid base64 value"  # no --media-path: base64 only
    assert await read_media("Y2F0", policy) == b"cat"  # base64 wins where the text is base64


async def test_other_schemes_are_not_fetched():
    assert "only http and https" in await refused("ftp://example.com/cat.png")


def test_decode_returns_rgb():
    image = decode_image(png(5, 7))
    assert image.mode == "RGB" and image.size == (5, 7)


@pytest.mark.parametrize("size, max_side, max_pixels, words", [
    ((65, 2), 64, 10_000, "each side may be at most 64 pixels"),
    ((2, 65), 64, 10_000, "each side may be at most 64 pixels"),
    ((50, 50), 64, 2_000, "at most 2000 pixels are decoded"),
])
def test_the_size_caps_are_checked_from_the_header(size, max_side, max_pixels, words):
    with pytest.raises(MediaError) as info:
        decode_image(png(*size), max_side=max_side, max_pixels=max_pixels)
    assert info.value.status == 400 and words in info.value.message
    assert info.value.message.startswith("Failed to load image or audio file: ")


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG that claims a size and holds no pixel data at all."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IEND", b""))


@pytest.mark.parametrize("width, height, words", [
    (12_000, 12_000, "the image is 12000x12000; at most 67108864 pixels"),
    (20_000, 10, "the image is 20000x10; each side may be at most 16384"),
    (100_000, 100_000, "too large to decode"),
])
def test_a_huge_header_is_refused_without_decoding(width, height, words):
    """Refused from the header alone (decoding would allocate gigabytes)."""
    with pytest.raises(MediaError) as info:
        decode_image(_png_header_only(width, height))
    assert words in info.value.message


@pytest.mark.parametrize("data, words", [
    (b"definitely not an image", "not an image in a known format"),
    (noise_png()[:1500], "damaged"),  # truncated inside its pixel data
])
def test_undecodable_data(data, words):
    with pytest.raises(MediaError) as info:
        decode_image(data)
    assert info.value.status == 400 and words in info.value.message


def test_the_body_limit_follows_the_image_budget():
    mib = 1024 * 1024
    assert body_limit(20 * mib, 16) == -(-20 * mib * 16 * 4 // 3) + mib
    assert body_limit(1, 1, floor=64 * mib) == 64 * mib   # never below the general limit
    assert body_limit(1 << 40, 1 << 10) == 2 * 1024 * mib  # clamped at 2 GiB


def test_the_item_count_is_bounded():
    policy = MediaPolicy.from_settings(None, max_items=2, env={})
    policy.check_count(2)
    with pytest.raises(MediaError) as info:
        policy.check_count(3)
    assert info.value.status == 400 and info.value.message == (
        "the request carries 3 media items; at most 2 are accepted per request (--max-images)")

"""The request side of image input: placeholder placement and the gate."""

from __future__ import annotations

import base64
import io
from types import SimpleNamespace

import pytest
import trio

from mlxcel_trio.media import MediaPolicy
from mlxcel_trio.protocol.records import ImageInput, VisionInfo
from mlxcel_trio.server.http.errors import ApiError
from mlxcel_trio.server.request import media_input as M

VISION = VisionInfo(image_token=7, tokens_per_image=3)


def fake_tokenize(text: str, add_special: bool) -> list[int]:
    return ([1] if add_special else []) + [ord(c) for c in text]


def pic(digest: str) -> ImageInput:
    return ImageInput(b"\0\0\0", 1, 1, digest, 0)


def test_each_marker_becomes_its_images_placeholder_run():
    out = M.place("ab<m>c<m>", "<m>", [pic("x"), pic("y")], VISION, fake_tokenize, True)
    assert list(out) == [1, ord("a"), ord("b"), 7, 7, 7, ord("c"), 7, 7, 7]
    assert [(im.digest, im.start) for im in out.images] == [("x", 3), ("y", 7)]


def test_a_dynamic_family_places_the_grid_each_images_size_gives():
    from mlxcel_trio.protocol.image_layout import ImageGeometry

    grid = VisionInfo(image_token=7, family="pixtral", geometry=ImageGeometry(4, 16),
                      break_token=8, end_token=9)
    wide = ImageInput(b"", 8, 4, "w", 0)   # 2 columns, 1 row
    tall = ImageInput(b"", 4, 8, "t", 0)   # 1 column, 2 rows
    out = M.place("<m>a<m>", "<m>", [wide, tall], grid, fake_tokenize, False)
    assert list(out) == [7, 7, 9, ord("a"), 7, 8, 7, 9]
    assert [im.start for im in out.images] == [0, 4]


def test_a_marker_count_that_differs_is_upstreams_tokenize_failure():
    with pytest.raises(ApiError, match="^Failed to tokenize prompt$"):
        M.place("no marker", "<m>", [pic("x")], VISION, fake_tokenize, False)


def test_decode_and_data_urls():
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (3, 2), (10, 20, 30)).save(buf, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    data = trio.run(M.image_bytes, url, MediaPolicy())
    im = M.decode_image(data)
    assert (im.width, im.height, im.rgb[:3]) == (3, 2, bytes([10, 20, 30]))
    with pytest.raises(ApiError, match="Failed to load image"):
        M.decode_image(b"not an image")
    with pytest.raises(ApiError, match="only http and https URLs are fetched"):
        trio.run(M.image_bytes, "ftp://host/x.png", MediaPolicy())


def test_the_gate_refuses_before_reading(monkeypatch):
    async def never(url, state):
        raise AssertionError("the URL was read")

    monkeypatch.setattr(M, "image_bytes", never)
    served = SimpleNamespace(model_name="tiny", bridge=SimpleNamespace(info=SimpleNamespace(
        vision=None, audio=None)), state=SimpleNamespace(config=SimpleNamespace(mmproj_auto=True)))
    body = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/x.png"}}]}]}
    with pytest.raises(ApiError) as err:
        trio.run(M.chat_images, body, served)
    assert err.value.status == 501 and err.value.type == "not_supported_error"
    assert err.value.message.startswith(
        "image input is not supported - hint: the loaded checkpoint 'tiny' has no image tower")

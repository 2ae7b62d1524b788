"""Dynamic-resolution images against a real server: the tiny Pixtral
fixture (tiny's language model with a random Pixtral tower, 4-pixel
patches, longest edge 16) gives each image a grid of [IMG] tokens that
follows its size, rows ended by [IMG_BREAK] and the last by [IMG_END];
--image-min-tokens / --image-max-tokens move the grid as upstream's pixel
bounds do; a budget the checkpoint cannot honor is refused at startup."""

from __future__ import annotations

import base64
import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from .sse import post, startup_refusal

pytestmark = pytest.mark.e2e

QUESTION = "What is in this picture?"


def png(w: int, h: int, seed: int = 1) -> str:
    from PIL import Image

    rgb = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def span(rows: int, cols: int) -> int:
    """Prompt positions of a rows x cols grid: [IMG]*cols + a row end, per row."""
    return rows * (cols + 1)


def chat(srv, *images: str, max_tokens: int = 1) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b}"}}
             for b in images]
    body = {"messages": [{"role": "user", "content": [*parts, {"type": "text",
                                                                "text": QUESTION}]}],
            "max_tokens": max_tokens, "temperature": 0}
    r = post(srv.url, body, path="/v1/chat/completions")
    assert r.status_code == 200, r.text
    return r.json()


def image_tokens(srv, image: str) -> int:
    """The positions one image took, from the server's usage: the prompt
    with it less the same prompt without it."""
    return (chat(srv, image)["usage"]["prompt_tokens"]
            - chat(srv)["usage"]["prompt_tokens"])


@pytest.fixture(scope="module")
def pixtral(tiny_pixtral_model, start_server):
    srv = start_server(tiny_pixtral_model, "-c", "1536", "-np", "3")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def budgeted(tiny_pixtral_model, start_server):
    srv = start_server(tiny_pixtral_model, "-c", "512", "-np", "1",
                       "--image-min-tokens", "9", "--image-max-tokens", "9")
    yield srv
    srv.stop()


LARGE, SMALL, SLIVER = png(30, 24), png(8, 6), png(4, 2)


def test_each_image_takes_the_grid_its_size_gives(pixtral):
    # 30x24 fits the 16-pixel edge as 16x12: 3 rows of 4; 8x6 rounds up to
    # 8x8: 2 rows of 2; a 4x2 sliver is one patch
    assert image_tokens(pixtral, LARGE) == span(3, 4) == 15
    assert image_tokens(pixtral, SMALL) == span(2, 2) == 6
    assert image_tokens(pixtral, SLIVER) == span(1, 1)
    both = chat(pixtral, LARGE, SMALL)["usage"]["prompt_tokens"]
    assert both == chat(pixtral)["usage"]["prompt_tokens"] + 15 + 6


def test_a_token_budget_moves_the_grid_as_upstream(budgeted):
    # 9 tokens = 144 pixels of 4x4 patches: the large image shrinks to 12x8
    # (6 [IMG] <= 9, from 12), the small one grows to 16x12 (12 [IMG] >= 9,
    # from 4), the sliver to 20x12, wider than the tower's nominal 16 pixels
    assert image_tokens(budgeted, LARGE) == span(2, 3)
    assert image_tokens(budgeted, SMALL) == span(3, 4)
    assert image_tokens(budgeted, SLIVER) == span(3, 5)
    assert chat(budgeted, SLIVER, max_tokens=4)["choices"][0]["finish_reason"] == "length"


def test_the_picture_changes_the_answer(pixtral):
    def say(image):
        return chat(pixtral, image, max_tokens=8)["choices"][0]["message"]["content"]

    a, b = say(png(30, 24, seed=1)), say(png(30, 24, seed=2))
    assert a != b, "two different pictures of one size gave the same greedy answer"
    assert say(png(30, 24, seed=1)) == a


def test_an_image_batched_beside_text_gives_each_its_solo_result(pixtral):
    def text(prompt):
        r = post(pixtral.url, {"prompt": prompt, "n_predict": 12, "temperature": 0})
        assert r.status_code == 200, r.text
        return r.json()["content"]

    def image():
        return chat(pixtral, LARGE, max_tokens=12)["choices"][0]["message"]["content"]

    jobs = [image, lambda: text("Once upon a time"), lambda: text("The quick brown fox")]
    solo = [job() for job in jobs]
    with ThreadPoolExecutor(len(jobs)) as pool:
        for _ in range(2):
            assert [f.result() for f in [pool.submit(job) for job in jobs]] == solo


def test_budgets_that_cannot_be_honored_are_refused_at_startup(tiny_pixtral_model,
                                                                tiny_vlm_model):
    # upstream's clip loader sentence, in pixels (tokens x 16 here)
    err = startup_refusal(tiny_pixtral_model, "--image-min-tokens", "12",
                          "--image-max-tokens", "6")
    assert "image_max_pixels (96) is less than image_min_pixels (192)" in err
    assert "--image-min-tokens 12, --image-max-tokens 6" in err
    # llava's fixed square has no bound to move: the flag and checkpoint are named
    err = startup_refusal(tiny_vlm_model, "--image-max-tokens", "64")
    assert "--image-max-tokens 64: the checkpoint" in err
    assert str(tiny_vlm_model) in err and "fixed geometry (llava)" in err

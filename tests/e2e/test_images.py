"""Image input against a real server: the tiny llava fixture (tiny's
language model with a random CLIP tower) answers OpenAI image_url parts,
Anthropic image blocks and /completion's multimodal_data, and what the
picture is changes what it says; a text-only checkpoint and --no-mmproj
refuse an image part with upstream's leading clause at 501 before reading
its URL."""

from __future__ import annotations

import base64
import io
import re

import anthropic
import numpy as np
import openai
import pytest

from .sse import post

pytestmark = pytest.mark.e2e

QUESTION = "What is in this picture?"
# a URL nothing listens on: reading it would fail with another error
UNREAD = "http://127.0.0.1:9/never-read.png"


def png(seed: int) -> str:
    from PIL import Image

    rgb = np.random.default_rng(seed).integers(0, 256, (24, 30, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def image_part(seed: int) -> dict:
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png(seed)}"}}


def user(*parts) -> list[dict]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": QUESTION}]}]


@pytest.fixture(scope="module")
def media_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    (root / "pic.png").write_bytes(base64.b64decode(png(1)))
    return root


@pytest.fixture(scope="module")
def vlm(tiny_vlm_model, start_server, media_root):
    return start_server(tiny_vlm_model, "-c", "1024", "-np", "2",
                        "--media-path", str(media_root), "--max-images", "2")


@pytest.fixture(scope="module")
def oai(vlm) -> openai.OpenAI:
    with openai.OpenAI(base_url=vlm.url + "/v1", api_key="x", max_retries=0, timeout=60) as c:
        yield c


def ask(oai, messages) -> str:
    r = oai.chat.completions.create(model="m", messages=messages, max_tokens=8, temperature=0)
    return r.choices[0].message.content


def test_openai_image_url_is_seen_and_matches_native_multimodal_data(vlm, oai):
    a, b = ask(oai, user(image_part(1))), ask(oai, user(image_part(2)))
    assert a != b, "two different pictures gave the same greedy answer"
    assert ask(oai, user(image_part(1))) == a
    # /completion's multimodal_data on the same rendered prompt says the same
    import httpx

    marker = httpx.get(vlm.url + "/props").json()["media_marker"]
    rendered = post(vlm.url, {"messages": user(image_part(1))}, path="/apply-template").json()
    prompt = re.sub(r"<__media_[0-9a-f]+__>", marker, rendered["prompt"])
    native = post(vlm.url, {"prompt": {"prompt_string": prompt, "multimodal_data": [png(1)]},
                            "n_predict": 8, "temperature": 0})
    assert native.status_code == 200, native.text
    assert native.json()["content"] == a


def test_props_and_marker_count(vlm, server):
    import httpx

    assert httpx.get(vlm.url + "/props").json()["modalities"]["vision"] is True
    assert httpx.get(server.url + "/props").json()["modalities"]["vision"] is False
    assert httpx.get(vlm.url + "/v1/models").json()["models"][0]["capabilities"] == [
        "completion", "multimodal"]
    # upstream's tokenize failure when markers and files disagree; the
    # marker is drawn per process, so the usual spelling is plain text here
    marker = httpx.get(vlm.url + "/props").json()["media_marker"]
    assert re.fullmatch(r"<__media_[0-9a-f]{32}__>", marker), marker
    for text in ("no marker", "<__media__>"):
        r = post(vlm.url, {"prompt": {"prompt_string": text, "multimodal_data": [png(1)]}})
        assert r.status_code == 400 and r.json()["error"]["message"] == "Failed to tokenize prompt"


def test_anthropic_image_block(vlm, oai):
    with anthropic.Anthropic(base_url=vlm.url, api_key="x", max_retries=0, timeout=60) as c:
        msg = c.messages.create(model="m", max_tokens=8, extra_body={"temperature": 0}, messages=[{
            "role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": png(2)}},
                {"type": "text", "text": QUESTION}]}])
    assert msg.content[0].text == ask(oai, user(image_part(2)))


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": user({"type": "image_url",
                                                "image_url": {"url": UNREAD}})}),
    ("/v1/responses", {"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": UNREAD},
        {"type": "input_text", "text": QUESTION}]}]}),
    ("/v1/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": UNREAD}},
        {"type": "text", "text": QUESTION}]}]}),
])
def test_text_only_checkpoint_refuses_images_with_501(server, path, body):
    r = post(server.url, body, path=path)
    assert r.status_code == 501, r.text
    err = r.json()["error"]
    assert err["type"] == "not_supported_error"
    assert err["message"].startswith("image input is not supported - hint: the loaded "
                                     "checkpoint '")
    assert "has no image tower" in err["message"] and "mmproj" not in err["message"]


def test_no_mmproj_refuses_images(tiny_vlm_model, start_server):
    # LLAMA_MEDIA_MARKER pins the marker, as upstream's own tests do
    srv = start_server(tiny_vlm_model, "-c", "512", "-np", "1", "--no-mmproj", "--no-warmup",
                       env={"LLAMA_MEDIA_MARKER": "<__media__>"})
    import httpx

    props = httpx.get(srv.url + "/props").json()
    assert props["modalities"]["vision"] is False and props["media_marker"] == "<__media__>"
    r = post(srv.url, {"messages": user(image_part(1))}, path="/v1/chat/completions")
    assert r.status_code == 501 and r.json()["error"]["message"].startswith(
        "image input is not supported - hint: the server was started with --no-mmproj")
    r = post(srv.url, {"prompt": {"prompt_string": "<__media__>", "multimodal_data": [png(1)]}})
    assert r.status_code == 400 and "does not support multimodal" in r.text
    srv.stop()


def test_responses_input_image(vlm, oai):
    r = oai.responses.create(model="m", max_output_tokens=8, temperature=0, input=[{
        "role": "user", "content": [
            {"type": "input_image", "image_url": f"data:image/png;base64,{png(3)}"},
            {"type": "input_text", "text": QUESTION}]}])
    assert r.output_text == ask(oai, user(image_part(3)))


def test_urls_go_through_the_media_room(vlm, oai, media_root):
    """file:// reads under --media-path (the same picture as inline data
    gives the same answer); a loopback http URL is refused by the address
    guard before anything is fetched; --max-images bounds the parts."""
    inline = ask(oai, user(image_part(1)))
    for url in ("file://pic.png", f"file://{media_root}/pic.png"):
        assert ask(oai, user({"type": "image_url", "image_url": {"url": url}})) == inline
    body = {"messages": user({"type": "image_url", "image_url": {"url": UNREAD}}),
            "max_tokens": 4}
    r = post(vlm.url, body, path="/v1/chat/completions")
    assert r.status_code == 400 and "loopback" in r.json()["error"]["message"], r.text
    escape = {"messages": user({"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}),
              "max_tokens": 4}
    r = post(vlm.url, escape, path="/v1/chat/completions")
    assert r.status_code == 400
    assert "file path escapes the --media-path root" in r.json()["error"]["message"]
    three = {"messages": user(image_part(1), image_part(2), image_part(3)), "max_tokens": 4}
    r = post(vlm.url, three, path="/v1/chat/completions")
    assert r.status_code == 400 and "--max-images" in r.json()["error"]["message"], r.text

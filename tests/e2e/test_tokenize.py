"""POST /tokenize and /detokenize against a real server.

The oracle for ids is the checkpoint's own `tokenizer.json` loaded with the
`tokenizers` library in the test process.  The fixture tokenizer is byte-level
BPE trained on a small corpus, so most CJK characters and emoji are split
across tokens: their pieces are not valid UTF-8 on their own and come back as
byte arrays.
"""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from .sse import post

pytestmark = pytest.mark.e2e

IM_END = "<|im_end|>"
MIXED_TEXT = "héllo wörld 日本語のテキスト 😀🎉 naïve café 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🦜🪐"


@pytest.fixture(scope="module")
def hf(tiny_model) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_model / "tokenizer.json"))


def tokenize(server, **body):
    r = post(server.url, body, path="/tokenize")
    assert r.status_code == 200, r.text
    return r.json()


def detokenize(server, **body) -> dict:
    r = post(server.url, body, path="/detokenize")
    assert r.status_code == 200, r.text
    return r.json()


def test_content_string(server, hf):
    res = tokenize(server, content="Hello world, hello tokens")
    assert list(res) == ["tokens"]
    assert res["tokens"] == hf.encode("Hello world, hello tokens", add_special_tokens=False).ids
    assert len(res["tokens"]) > 3


def test_content_absent_is_an_empty_list(server):
    assert tokenize(server) == {"tokens": []}
    assert tokenize(server, with_pieces=True, add_special=True) == {"tokens": []}
    assert tokenize(server, content="") == {"tokens": []}


def test_mixed_array_of_strings_and_ids(server, hf):
    head = hf.encode("Hello", add_special_tokens=False).ids
    tail = hf.encode(" world", add_special_tokens=False).ids
    res = tokenize(server, content=["Hello", 7, 1538, " world"])
    assert res["tokens"] == head + [7, 1538] + tail


def test_add_special_defaults_to_false(server, hf, tiny_facts):
    # The fixture declares no BOS and no post-processor: add_special must not
    # invent one, and the default must equal the explicit false.
    text = "Hello world"
    plain = hf.encode(text, add_special_tokens=False).ids
    assert tokenize(server, content=text)["tokens"] == plain
    assert tokenize(server, content=text, add_special=False)["tokens"] == plain
    assert tokenize(server, content=text, add_special=True)["tokens"] == \
        hf.encode(text, add_special_tokens=True).ids


def test_parse_special(server, tiny_facts):
    im_end = tiny_facts["special_tokens"][IM_END]
    default = tokenize(server, content=f"a{IM_END}b")["tokens"]
    assert im_end in default and len(default) == 3
    literal = tokenize(server, content=f"a{IM_END}b", parse_special=False)["tokens"]
    assert im_end not in literal
    assert len(literal) > 3
    # the literal spelling still decodes to the same text
    assert detokenize(server, tokens=literal)["content"] == f"a{IM_END}b"
    assert tokenize(server, content=IM_END, parse_special=True)["tokens"] == [im_end]


def test_with_pieces_strings_and_byte_arrays(server, hf):
    res = tokenize(server, content=MIXED_TEXT, with_pieces=True)["tokens"]
    assert [t["id"] for t in res] == hf.encode(MIXED_TEXT, add_special_tokens=False).ids
    assert all(list(t) == ["id", "piece"] for t in res)
    raw = b""
    kinds = set()
    for t in res:
        piece = t["piece"]
        if isinstance(piece, str):
            kinds.add("str")
            raw += piece.encode("utf-8")
        else:
            kinds.add("bytes")
            assert isinstance(piece, list) and all(0 <= b <= 255 for b in piece), piece
            with pytest.raises(UnicodeDecodeError):
                bytes(piece).decode("utf-8")  # only invalid UTF-8 is sent as bytes
            raw += bytes(piece)
    assert kinds == {"str", "bytes"}
    assert any(isinstance(t["piece"], str) and not t["piece"].isascii() for t in res)
    assert raw == MIXED_TEXT.encode("utf-8")


def test_with_pieces_emoji_alone(server):
    text = "😀🎉🦜🪐"
    res = tokenize(server, content=text, with_pieces=True)["tokens"]
    assert any(isinstance(t["piece"], list) for t in res), res
    raw = b"".join(bytes(p) if isinstance(p, list) else p.encode() for p in
                   (t["piece"] for t in res))
    assert raw == text.encode("utf-8")


def test_detokenize_renders_special_tokens(server, tiny_facts):
    im_end = tiny_facts["special_tokens"][IM_END]
    im_start = tiny_facts["special_tokens"]["<|im_start|>"]
    assert detokenize(server, tokens=[im_end]) == {"content": IM_END}
    hello = tokenize(server, content="hello")["tokens"]
    assert detokenize(server, tokens=[im_start, *hello, im_end])["content"] == \
        f"<|im_start|>hello{IM_END}"


def test_detokenize_broken_bytes_become_replacement_chars(server):
    pieces = tokenize(server, content=MIXED_TEXT, with_pieces=True)["tokens"]
    partial = [t for t in pieces if isinstance(t["piece"], list)]
    assert partial, pieces
    for t in partial[:4]:
        expected = bytes(t["piece"]).decode("utf-8", errors="replace")
        got = detokenize(server, tokens=[t["id"]])["content"]
        assert got == expected and "\ufffd" in got
    # the same ids with their neighbours decode cleanly
    ids = [t["id"] for t in pieces]
    assert detokenize(server, tokens=ids)["content"] == MIXED_TEXT


def test_detokenize_absent_or_empty(server):
    assert detokenize(server) == {"content": ""}
    assert detokenize(server, tokens=[]) == {"content": ""}


@pytest.mark.parametrize("text", [
    MIXED_TEXT,
    "def main():\n    return 0\n",
    "  leading and trailing spaces  ",
    "tabs\tand\r\nnewlines",
    "Привет мир ∑∫√ 한국어",
])
def test_round_trip(server, text):
    ids = tokenize(server, content=text)["tokens"]
    assert detokenize(server, tokens=ids) == {"content": text}


@pytest.mark.parametrize("path,body,message", [
    ("/tokenize", {"content": 5}, "type must be string, but is number"),
    ("/tokenize", {"content": {"a": 1}}, "type must be string, but is object"),
    ("/tokenize", {"content": ["a", None]}, "type must be number, but is null"),
    ("/tokenize", {"content": [1, [2]]}, "type must be number, but is array"),
    ("/detokenize", {"tokens": "abc"}, "type must be array, but is string"),
    ("/detokenize", {"tokens": [1, "x"]}, "type must be number, but is string"),
])
def test_wrong_types_are_upstream_type_errors(server, path, body, message):
    # upstream reads these with nlohmann get<T>() outside any try-block, so
    # ex_wrapper answers 500 with the library text (error_messages.json); we
    # answer the 400 it meant, same text (issue #7, recorded in the manifest)
    r = post(server.url, body, path=path)
    assert r.status_code == 400
    assert r.json() == {"error": {"code": 400, "type": "invalid_request_error",
                                  "message": f"[json.exception.type_error.302] {message}"}}


def test_numbers_are_accepted_as_ids(server):
    # nlohmann's get<int>() truncates a float and takes a boolean
    assert tokenize(server, content=[7.9, True])["tokens"] == [7, 1]
    assert detokenize(server, tokens=[71.0, 72])["content"] == \
        detokenize(server, tokens=[71, 72])["content"]

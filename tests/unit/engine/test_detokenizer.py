"""TokenTable and IncrementalDetokenizer against real `tokenizers` models."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from mlxcel_trio.engine.detokenizer import IncrementalDetokenizer, TokenTable

CORPUS = [
    "Hello world, héllo wörld! Ça va? naïve café, garçon, Ærøskøbing.",
    "日本語のテキストです。中文文本测试。한국어 텍스트도 있어요.",
    "emoji 😀🎉👍 party 🚀 and flags 🇫🇷 🇯🇵 plus ∑ ∞ ≠ symbols",
    "The quick brown fox jumps over the lazy dog 1234567890.",
] * 4

SAMPLES = [
    "Hello world",
    "héllo wörld, naïve café",
    "日本語のテキスト 中文",
    "party 😀🎉 🚀 🇫🇷",
    "mixed: Ça va? 測試 ∑≠ 👍 done",
]


@pytest.fixture(scope="module")
def bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens(["<tool_call>", "ñandú"])  # non-special added tokens
    return tok


@pytest.fixture(scope="module")
def table(bpe: Tokenizer) -> TokenTable:
    return TokenTable(bpe)


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_byte_level_detected_and_sized(bpe: Tokenizer, table: TokenTable) -> None:
    assert table.kind == "byte_level"
    assert len(table) == bpe.get_vocab_size(with_added_tokens=True)
    # The point of the exercise: some tokens are fragments of a character.
    assert any(not _is_utf8(table.bytes_of(i)) for i in range(len(table)))


@pytest.mark.parametrize("text", SAMPLES)
def test_matches_tokenizer_decode(bpe: Tokenizer, table: TokenTable, text: str) -> None:
    ids = bpe.encode(text).ids
    assert table.decode(ids) == text
    assert table.decode(ids) == bpe.decode(ids, skip_special_tokens=False)
    assert b"".join(table.bytes_of(i) for i in ids) == text.encode("utf-8")


def test_added_and_special_tokens_render(bpe: Tokenizer, table: TokenTable) -> None:
    for content in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]:
        tid = bpe.token_to_id(content)
        assert table.bytes_of(tid) == content.encode()
        assert table.is_special(tid)
    call = bpe.token_to_id("<tool_call>")
    assert table.bytes_of(call) == b"<tool_call>" and not table.is_special(call)
    # Added content is plain UTF-8, not pushed through the byte-level map.
    assert table.bytes_of(bpe.token_to_id("ñandú")) == "ñandú".encode()
    ids = bpe.encode("<|im_start|>héllo 日本語<|im_end|>").ids
    assert table.decode(ids) == "<|im_start|>héllo 日本語<|im_end|>"
    assert not table.is_special(bpe.encode("Hello").ids[0])


def test_out_of_range_ids(table: TokenTable) -> None:
    n = len(table)
    for bad in (n, n + 1, n + 10_000, -1):
        assert table.bytes_of(bad) == b""
    assert table.decode([n, n + 5]) == ""


def test_accepts_wrappers(bpe: Tokenizer) -> None:
    class Fast:  # transformers' fast tokenizer shape
        backend_tokenizer = bpe

    class Wrapper:  # mlx-lm's TokenizerWrapper shape
        _tokenizer = Fast()

    assert TokenTable(Wrapper()).bytes_of(5) == TokenTable(bpe).bytes_of(5)
    with pytest.raises(TypeError):
        TokenTable(object())


def test_streaming_holds_partial_characters(bpe: Tokenizer, table: TokenTable) -> None:
    text = "😀 日本語 héllo 🇫🇷"
    ids = bpe.encode(text).ids
    det = IncrementalDetokenizer(table)
    pieces = [det.push(i) for i in ids]
    assert "".join(pieces) + det.flush() == text
    assert all("\ufffd" not in p for p in pieces)
    assert det.pending_bytes == 0


class _RawBytes:
    """A stand-in table whose 'tokens' are arbitrary byte strings."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    def bytes_of(self, i: int) -> bytes:
        return self.pieces[i]


def _stream(pieces: list[bytes]) -> tuple[list[str], str, list[int]]:
    det = IncrementalDetokenizer(_RawBytes(pieces))  # type: ignore[arg-type]
    outs, pend = [], []
    for i in range(len(pieces)):
        outs.append(det.push(i))
        pend.append(det.pending_bytes)
    return outs, det.flush(), pend


def test_invalid_bytes_emitted_immediately() -> None:
    outs, tail, _ = _stream([b"\x80", b"a\xe0\x80", b"\xf0\x9f", b"\x98", b"A"])
    assert outs == ["\ufffd", "a\ufffd\ufffd", "", "", "\ufffdA"]
    assert tail == ""
    # A surrogate prefix can never complete: it must not be held back.
    outs, tail, pend = _stream([b"x\xed\xa0", b"\xbf"])
    assert outs == ["x\ufffd\ufffd", "\ufffd"] and pend == [0, 0] and tail == ""
    outs, tail, _ = _stream([b"\xe4\xb8"])
    assert outs == [""] and tail == "\ufffd"


_UTF8_BITS = st.sampled_from(
    [b"\x80", b"\xbf", b"\xc2", b"\xc3", b"\xe0", b"\xe4", b"\xed", b"\xf0",
     b"\xf4", b"\xff", b"\xa0", b"\x9f", b"\x90", b"a", b" ", b"\xc3\xa9",
     b"\xe4\xb8\xad", b"\xf0\x9f\x98\x80", b"\xed\xa0\x80", b"\xef\xbf\xbd"]
)
_PIECES = st.lists(
    st.one_of(st.binary(max_size=6), st.lists(_UTF8_BITS, max_size=4).map(b"".join)),
    max_size=30,
)


@settings(max_examples=400, deadline=None)
@given(_PIECES)
def test_stream_invariant_random_bytes(pieces: list[bytes]) -> None:
    outs, tail, pend = _stream(pieces)
    assert "".join(outs) + tail == b"".join(pieces).decode("utf-8", "replace")
    for out in outs + [tail]:
        out.encode("utf-8")  # raises on a lone surrogate
    assert all(0 <= p <= 3 for p in pend)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_stream_invariant_random_ids(table: TokenTable, data: st.DataObject) -> None:
    ids = data.draw(st.lists(st.integers(-2, len(table) + 3), max_size=40))
    det = IncrementalDetokenizer(table)
    outs = [det.push(i) for i in ids]
    assert "".join(outs) + det.flush() == table.decode(ids)
    for out in outs:
        out.encode("utf-8")
    assert det.pending_bytes == 0  # flush resets; the detokenizer is reusable


# --- SentencePiece style (Metaspace + byte fallback) -----------------------

def _spm(decoder: object) -> Tokenizer:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    merges = [("▁", "h"), ("▁h", "e"), ("l", "l"), ("▁he", "ll"), ("▁hell", "o"),
              ("▁", "w"), ("▁w", "o"), ("▁wo", "r"), ("▁wor", "l"), ("▁worl", "d")]
    for piece in ["▁", "h", "e", "l", "o", "w", "r", "d", "é", *map("".join, merges)]:
        vocab.setdefault(piece, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>",
                               byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoder
    tok.add_special_tokens(["<s>", "</s>"])
    return tok


SPM_DECODERS = {
    "metaspace": lambda: decoders.Sequence([
        decoders.ByteFallback(),
        decoders.Metaspace(replacement="▁", prepend_scheme="always")]),
    "llama_sequence": lambda: decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(" ", 1, 0)]),
}


@pytest.mark.parametrize("name", sorted(SPM_DECODERS))
def test_sentencepiece_style(name: str) -> None:
    tok = _spm(SPM_DECODERS[name]())
    assert json.loads(tok.to_str())["model"]["byte_fallback"] is True
    table = TokenTable(tok)
    assert table.kind == "sentencepiece"
    assert table.bytes_of(tok.token_to_id("▁hello")) == b" hello"
    assert table.bytes_of(tok.token_to_id("▁")) == b" "
    assert table.bytes_of(tok.token_to_id("<0xE4>")) == b"\xe4"
    assert table.bytes_of(tok.token_to_id("<0x0A>")) == b"\n"
    assert table.bytes_of(tok.token_to_id("é")) == "é".encode()
    assert table.bytes_of(tok.token_to_id("<s>")) == b"<s>" and table.is_special(1)

    text = "hello world 中é\n"
    enc = tok.encode(text)
    assert "<0xE4>" in enc.tokens  # '中' fell back to bytes
    # The table keeps the leading space that the decoders strip at the start.
    assert table.decode(enc.ids) == " " + text
    assert table.decode(enc.ids).removeprefix(" ") == tok.decode(enc.ids)
    det = IncrementalDetokenizer(table)
    outs = [det.push(i) for i in enc.ids]
    assert "".join(outs) + det.flush() == " " + text
    assert "\ufffd" not in "".join(outs)


def test_byte_fallback_detected_from_model_flag() -> None:
    # Plain Metaspace decoder: byte fallback is known only from the model.
    tok = _spm(decoders.Metaspace(replacement="▁", prepend_scheme="always"))
    table = TokenTable(tok)
    assert table.bytes_of(tok.token_to_id("<0xE4>")) == b"\xe4"
    assert table.bytes_of(tok.token_to_id("▁world")) == b" world"

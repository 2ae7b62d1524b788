"""Token id -> bytes table and a streaming UTF-8 detokenizer.

``TokenTable`` is built once per model.  It turns every token id into the exact
bytes that token stands for, so detokenizing never re-decodes a sequence:

* byte-level BPE (GPT-2 / Qwen style, ``ByteLevel`` decoder): each character of
  the token spelling is mapped back through the GPT-2 bytes-to-unicode table;
* SentencePiece style (``Metaspace`` decoder or ``Replace("▁", " ")``, with
  byte fallback): ``▁`` becomes a space and ``<0xAB>`` becomes the byte 0xAB.
  The strip of one leading space that such decoders apply to the very first
  token of a text is deliberately NOT reproduced (the table is position free);
* added tokens, special or not, render as their content in UTF-8 (llama-server
  renders special tokens too);
* ids without a token (gaps, or an embedding padded past the vocabulary) and
  negative ids give ``b""``.
Other decoders fall back to the token spelling encoded as UTF-8.

Invariant of ``IncrementalDetokenizer`` (one per sequence): for any ids,
``"".join(d.push(i) for i in ids) + d.flush() == table.decode(ids)``, where
``table.decode`` is ``bytes.decode("utf-8", errors="replace")`` of the joined
bytes.  ``push`` holds back only a trailing sequence that may still become a
valid character; bytes that can never be valid come out at once as U+FFFD.
Per-token work is proportional to the token's byte length.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterable
from typing import Any

__all__ = ["TokenTable", "IncrementalDetokenizer", "resolve_tokenizer"]

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_inverse() -> dict[int, int]:
    """Code point -> byte, inverting GPT-2's printable remapping of bytes."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    inverse = {b: b for b in printable}
    shift = 0
    for b in range(256):
        if b not in inverse:  # unprintable bytes were moved to U+0100 onwards
            inverse[256 + shift] = b
            shift += 1
    return inverse


def resolve_tokenizer(obj: Any) -> Any:
    """Find the ``tokenizers.Tokenizer`` inside a transformers/mlx-lm wrapper."""
    from tokenizers import Tokenizer

    for _ in range(5):
        if isinstance(obj, Tokenizer):
            return obj
        inner = getattr(obj, "backend_tokenizer", None) or getattr(obj, "_tokenizer", None)
        if inner is None:
            break
        obj = inner
    raise TypeError(f"no tokenizers.Tokenizer found in {type(obj).__name__}")


def _walk(node: Any) -> Iterable[dict]:
    """Yield a decoder/pre-tokenizer node and every node nested in a Sequence."""
    if isinstance(node, dict):
        yield node
        for child in node.get("decoders") or node.get("pretokenizers") or ():
            yield from _walk(child)


class TokenTable:
    """Immutable id -> bytes map for one tokenizer."""

    __slots__ = ("_bytes", "_special", "kind")

    def __init__(self, tokenizer: Any) -> None:
        tok = resolve_tokenizer(tokenizer)
        spec = json.loads(tok.to_str())
        decoders = list(_walk(spec.get("decoder")))
        dtypes = {d.get("type") for d in decoders}
        pre_types = {p.get("type") for p in _walk(spec.get("pre_tokenizer"))}
        model = spec.get("model") or {}

        replaces: list[tuple[str, str]] = []
        for d in decoders:
            if d.get("type") == "Metaspace":
                replaces.append((d.get("replacement", "\u2581"), " "))
            elif d.get("type") == "Replace" and "String" in (d.get("pattern") or {}):
                replaces.append((d["pattern"]["String"], d.get("content", "")))
        byte_level = "ByteLevel" in dtypes or (not decoders and "ByteLevel" in pre_types)
        byte_fallback = bool(model.get("byte_fallback")) or "ByteFallback" in dtypes
        self.kind = "byte_level" if byte_level else "sentencepiece" if replaces else "plain"

        added = {a["id"]: a for a in spec.get("added_tokens") or ()}
        ids = tok.get_vocab(with_added_tokens=True).values()  # may have gaps
        size = max([0, *(i + 1 for i in ids), *(i + 1 for i in added)])
        inverse = _byte_level_inverse()
        trans = {cp: chr(b) for cp, b in inverse.items()}

        table: list[bytes] = []
        for i in range(size):
            if i in added:
                table.append(added[i]["content"].encode("utf-8"))
                continue
            piece = tok.id_to_token(i)
            if piece is None:
                table.append(b"")
            elif byte_level:
                mapped = piece.translate(trans)
                try:
                    table.append(mapped.encode("latin-1"))
                except UnicodeEncodeError:  # a char outside the byte alphabet
                    table.append(b"".join(
                        bytes([inverse[ord(c)]]) if ord(c) in inverse else c.encode()
                        for c in piece))
            else:
                m = _BYTE_TOKEN.fullmatch(piece) if byte_fallback else None
                if m:
                    table.append(bytes([int(m.group(1), 16)]))
                    continue
                for old, new in replaces:
                    piece = piece.replace(old, new)
                table.append(piece.encode("utf-8"))
        self._bytes: tuple[bytes, ...] = tuple(table)
        self._special = frozenset(i for i, a in added.items() if a.get("special"))

    def __len__(self) -> int:
        return len(self._bytes)

    def bytes_of(self, token_id: int) -> bytes:
        if 0 <= token_id < len(self._bytes):
            return self._bytes[token_id]
        return b""

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special

    def decode(self, ids: Iterable[int]) -> str:
        """Joined bytes of ``ids`` as text; broken UTF-8 becomes U+FFFD."""
        b, n = self._bytes, len(self._bytes)
        return b"".join(b[i] for i in ids if 0 <= i < n).decode("utf-8", "replace")


_Utf8Decoder = codecs.getincrementaldecoder("utf-8")


class IncrementalDetokenizer:
    """Streams the text of one generated sequence, token by token."""

    __slots__ = ("_table", "_decoder", "_decode")

    def __init__(self, table: TokenTable) -> None:
        self._table = table
        self._decoder = _Utf8Decoder("replace")
        self._decode = self._decoder.decode

    def push(self, token_id: int) -> str:
        """Add one token; return the text that is now complete."""
        data = self._table.bytes_of(token_id)
        text = self._decode(data, False)
        if not data.isascii():
            # CPython keeps ED A0..BF (a surrogate's prefix) pending although
            # no later byte can make it valid; render it now, as the one-shot
            # decode of any continuation would.
            held = self._decoder.getstate()[0]
            if len(held) >= 2 and held[0] == 0xED and held[1] >= 0xA0:
                text += self._decode(b"", True)
        return text

    def push_many(self, ids: Iterable[int]) -> str:
        return "".join([self.push(i) for i in ids])

    def flush(self) -> str:
        """Return the held bytes (as U+FFFD) and reset for reuse."""
        return self._decode(b"", True)

    @property
    def pending_bytes(self) -> int:
        return len(self._decoder.getstate()[0])

"""The n-gram lookup cache file (llama.cpp's `common_ngram_cache` layout),
read by the ngram-cache drafter and checked by the command line before the
model loads.

Per entry: the n-gram as four int32 token ids padded with -1, an int32
count of followers, then (token, count) int32 pairs, little-endian.
"""

from __future__ import annotations

import struct
from pathlib import Path

NGRAM_MAX = 4                   # ids per stored n-gram
NULL = -1                       # LLAMA_TOKEN_NULL: the padding of a short n-gram

Table = dict[tuple[int, ...], dict[int, int]]   # n-gram -> {next token: count}


class CacheFileError(ValueError):
    pass


_NGRAM = struct.Struct(f"<{NGRAM_MAX}i")
_I32 = struct.Struct("<i")
_PAIR = struct.Struct("<ii")


def load_table(path: str | Path) -> Table:
    """The table a lookup cache file holds; CacheFileError on any other shape."""
    data = Path(path).read_bytes()
    table: Table = {}
    pos, end = 0, len(data)
    while pos < end:
        if end - pos < _NGRAM.size + _I32.size:
            raise CacheFileError(f"truncated entry at byte {pos}")
        ids = _NGRAM.unpack_from(data, pos)
        (n,) = _I32.unpack_from(data, pos + _NGRAM.size)
        pos += _NGRAM.size + _I32.size
        if n <= 0 or end - pos < n * _PAIR.size:
            raise CacheFileError(f"bad follower count {n} at byte {pos - _I32.size}")
        key = tuple(t for t in ids if t != NULL)
        part = table.setdefault(key, {})
        for token, count in _PAIR.iter_unpack(data[pos:pos + n * _PAIR.size]):
            if count <= 0:
                raise CacheFileError(f"non-positive count {count} for token {token}")
            part[token] = count
        pos += n * _PAIR.size
    return table


def dump_table(table: Table) -> bytes:
    """The inverse of load_table (tests and tooling write files with it)."""
    out = bytearray()
    for key, part in table.items():
        out += _NGRAM.pack(*key, *([NULL] * (NGRAM_MAX - len(key))))
        out += _I32.pack(len(part))
        for token, count in part.items():
            out += _PAIR.pack(token, count)
    return bytes(out)

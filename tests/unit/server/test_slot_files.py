"""Slot-file name rules (upstream's fs_validate_filename) and confinement."""

from __future__ import annotations

import os

import pytest

from mlxcel_trio.server.sessions.slot_files import confined, stoi, valid_filename


@pytest.mark.parametrize("name", ["a", "slot-0.bin", "café", "日本語.slot", "a b", ".hidden",
                                  "x" * 255, "a.b.c", "-", "~x"])
def test_accepted_names(name):
    assert valid_filename(name)


@pytest.mark.parametrize("name", [
    "", "x" * 256, "é" * 128,            # empty, over 255 bytes (128 x 2 bytes)
    "a/b", "a\\b", "..", "a..b", ".", "x.", " x", "x ",
    "a:b", "a*b", "a?b", 'a"b', "a<b", "a>b", "a|b",
    "a\x00b", "a\x1fb", "a\x7fb", "a\x85b",      # C0, DEL, C1
    "a\uff0eb", "a\u2215b", "a\u2216b",          # look-alikes of . / \\
    "a\ud800b", "a\ufffdb", "\ufeffa",          # surrogate, replacement, BOM
])
def test_refused_names(name):
    assert not valid_filename(name)


def test_confinement(tmp_path):
    root = os.path.realpath(tmp_path / "root")
    os.mkdir(root)
    assert confined(root, "a.slot") == os.path.join(root, "a.slot")
    outside = tmp_path / "outside"
    outside.write_text("x")
    os.symlink(outside, os.path.join(root, "out"))
    assert confined(root, "out") is None
    inside = os.path.join(root, "real")
    open(inside, "w").close()
    os.symlink(inside, os.path.join(root, "alias"))
    assert confined(root, "alias") == inside


@pytest.mark.parametrize(("text", "value"), [("0", 0), ("  7", 7), ("+3", 3), ("-1", -1),
                                             ("12abc", 12), ("2147483647", 2147483647)])
def test_stoi(text, value):
    assert stoi(text) == value


@pytest.mark.parametrize("text", ["", "abc", " ", "+", "2147483648", "-2147483649", "٣"])
def test_stoi_refuses(text):
    with pytest.raises(ValueError):
        stoi(text)


def test_read_refuses_what_is_not_a_regular_file(tmp_path):
    """A directory or a FIFO named like the file is "no slot file" (None),
    never an unhandled error or a worker thread blocked opening a FIFO."""
    import threading

    from mlxcel_trio.server.sessions.slot_files import read_file

    os.mkdir(tmp_path / "dir.slot")
    assert read_file(str(tmp_path / "dir.slot")) is None
    os.mkfifo(tmp_path / "fifo.slot")
    result: list = []
    t = threading.Thread(target=lambda: result.append(read_file(str(tmp_path / "fifo.slot"))),
                         daemon=True)
    t.start()
    t.join(5.0)
    if t.is_alive():  # unblock the thread: a writer lets its open() return
        with open(tmp_path / "fifo.slot", "wb"):
            pass
        t.join(5.0)
        raise AssertionError("read_file blocked opening a FIFO")
    assert result == [None]
    (tmp_path / "ok.slot").write_bytes(b"{}")
    assert read_file(str(tmp_path / "ok.slot")) == b"{}"


def test_a_symlink_planted_after_validation_is_neither_read_nor_written_through(tmp_path):
    """The TOCTOU window between confined() and the I/O: a symlink swapped in
    under the validated name is refused on read (O_NOFOLLOW) and replaced,
    never written through, on save (rename over the link)."""
    from mlxcel_trio.server.sessions.slot_files import read_file, write_atomic

    root = os.path.realpath(tmp_path / "root")
    os.mkdir(root)
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    path = confined(root, "a.slot")
    os.symlink(outside, path)              # planted after the check
    assert read_file(path) is None
    write_atomic(root, path, b"slot")
    assert outside.read_bytes() == b"precious"
    assert not os.path.islink(path) and open(path, "rb").read() == b"slot"
    assert [n for n in os.listdir(root) if n.startswith(".slot-")] == []

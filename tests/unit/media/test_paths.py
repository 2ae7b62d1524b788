"""file:// resolution inside --media-path: every rule of paths.py, on a
real temporary directory tree (no server)."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from mlxcel_trio.media import paths
from mlxcel_trio.media.errors import MediaError

CAT = b"\x89PNG cat bytes"


@pytest.fixture
def tree(tmp_path):
    """root/ holds cat.png and sub/dog.png; outside/ holds secret.txt."""
    root = tmp_path / "media"
    (root / "sub").mkdir(parents=True)
    (root / "cat.png").write_bytes(CAT)
    (root / "sub" / "dog.png").write_bytes(b"dog")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"secret")
    return os.path.realpath(root), os.path.realpath(outside)


def read(reference: str, root: str | None, limit: int = 1 << 20) -> bytes:
    return paths.read_file(reference, root, limit)


def refused(reference: str, root: str | None, limit: int = 1 << 20) -> str:
    with pytest.raises(MediaError) as info:
        read(reference, root, limit)
    assert info.value.status == 400 and info.value.type == "invalid_request_error"
    return info.value.message


def test_without_a_root_every_file_url_is_refused_with_upstreams_sentence():
    assert refused("cat.png", None) == \
        "file:// URLs are not allowed unless --media-path is specified"


def test_relative_and_upstreams_doubled_separators(tree):
    root, _ = tree
    assert read("cat.png", root) == CAT
    assert read("sub/dog.png", root) == b"dog"
    assert read("//sub//dog.png", root) == b"dog"  # upstream's file:////mtmd//x form


def test_an_absolute_reference_is_concatenated_first(tree):
    root, _ = tree
    nested = os.path.join(root, root.lstrip("/"))
    os.makedirs(nested)
    with open(os.path.join(nested, "cat.png"), "wb") as f:
        f.write(b"concatenated")
    # <root>/<root>/cat.png exists: concatenation wins over the absolute fallback
    assert read(root + "/cat.png", root) == b"concatenated"


def test_absolute_inside_the_root_is_read_by_the_fallback(tree):
    root, _ = tree
    assert read(root + "/cat.png", root) == CAT


def test_absolute_outside_the_root_is_an_escape_whether_or_not_it_exists(tree):
    root, outside = tree
    assert refused(outside + "/secret.txt", root) == \
        f"file path escapes the --media-path root: {outside}/secret.txt"
    # no existence oracle: a missing file outside answers the same way
    assert refused(outside + "/nothing.txt", root).startswith("file path escapes")


def test_a_missing_file_names_the_media_path(tree):
    root, _ = tree
    assert refused("nothing.png", root) == (
        "file does not exist or cannot be opened: nothing.png "
        "(file:// paths resolve inside the --media-path directory)")
    assert refused(root + "/nothing.png", root).startswith("file does not exist")


@pytest.mark.parametrize("reference", [
    "../outside/secret.txt", "sub/../cat.png", "a..b.png", "..", ".",
])
def test_dot_dot_anywhere_is_refused(tree, reference):
    assert refused(reference, tree[0]) == f"file path is not allowed: {reference}"


@pytest.mark.parametrize("reference", [
    "%2e%2e/outside/secret.txt", "%2E%2E%2Fsecret", "sub%2fdog.png", "sub%5Cdog.png",
    "cat.png%00.txt",
])
def test_percent_escapes_for_traversal_are_refused(tree, reference):
    assert refused(reference, tree[0]).startswith("file path is not allowed")


def test_other_percent_escapes_stay_literal(tree):
    root, _ = tree
    with open(os.path.join(root, "a%20b.png"), "wb") as f:
        f.write(b"literal")
    assert read("a%20b.png", root) == b"literal"  # never decoded, as upstream


@pytest.mark.parametrize("char", list(':*?"<>|') + ["\x00", "\x01", "\x1f", "\x7f", "\x85"])
def test_forbidden_characters(tree, char):
    assert refused(f"ca{char}t.png", tree[0]).startswith("file path is not allowed")


@pytest.mark.parametrize("char", ["\uff0e", "\u2215", "\u2216", "\ufffd", "\ufeff",
                                  chr(0xD800)])
def test_unicode_lookalikes_and_surrogates(tree, char):
    assert refused(f"sub{char}dog.png", tree[0]).startswith("file path is not allowed")


@pytest.mark.parametrize("reference", [" cat.png", "cat.png ", "cat.png.", ""])
def test_leading_or_trailing_space_trailing_dot_and_empty(tree, reference):
    assert refused(reference, tree[0]).startswith("file path is not allowed")


def test_the_255_byte_cap_is_on_the_whole_path_in_bytes(tree):
    root, _ = tree
    name = "é" * 126 + ".p"  # 254 bytes: under the cap in bytes
    with open(os.path.join(root, name), "wb") as f:
        f.write(b"ok")
    assert read(name, root) == b"ok"
    assert refused("é" * 127 + ".p", root).startswith("file path is not allowed")  # 256 bytes


def test_a_symlink_inside_the_root_resolves(tree):
    root, _ = tree
    os.symlink(os.path.join(root, "cat.png"), os.path.join(root, "alias.png"))
    os.symlink("sub", os.path.join(root, "linked"))
    assert read("alias.png", root) == CAT
    assert read("linked/dog.png", root) == b"dog"


def test_a_symlink_leaving_the_root_is_an_escape(tree):
    root, outside = tree
    os.symlink(os.path.join(outside, "secret.txt"), os.path.join(root, "leak.png"))
    os.symlink(outside, os.path.join(root, "leakdir"))
    assert refused("leak.png", root).startswith("file path escapes the --media-path root")
    assert refused("leakdir/secret.txt", root).startswith("file path escapes")


def test_a_symlink_swapped_in_after_resolution_fails_with_eloop(tree, monkeypatch):
    root, outside = tree
    real_open = paths.open_confined

    def swap_then_open(real, root_, reference):
        os.unlink(real)  # the race: the checked file becomes a link out
        os.symlink(os.path.join(outside, "secret.txt"), real)
        return real_open(real, root_, reference)

    monkeypatch.setattr(paths, "open_confined", swap_then_open)
    assert refused("cat.png", root) == "file path is not allowed: cat.png"


def test_a_directory_component_swapped_for_a_symlink_is_refused(tree, monkeypatch):
    root, outside = tree
    real_open = paths.open_confined
    os.makedirs(os.path.join(outside, "sub"))
    with open(os.path.join(outside, "sub", "dog.png"), "wb") as f:
        f.write(b"outside dog")

    def swap_then_open(real, root_, reference):
        os.rename(os.path.join(root, "sub"), os.path.join(root, "old-sub"))
        os.symlink(os.path.join(outside, "sub"), os.path.join(root, "sub"))
        return real_open(real, root_, reference)

    monkeypatch.setattr(paths, "open_confined", swap_then_open)
    assert refused("sub/dog.png", root) == "file path is not allowed: sub/dog.png"


def test_a_fifo_is_refused_without_blocking(tree):
    root, _ = tree
    os.mkfifo(os.path.join(root, "pipe.png"))
    outcome: list[str] = []
    worker = threading.Thread(target=lambda: outcome.append(refused("pipe.png", root)),
                              daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "reading a FIFO blocked"
    assert outcome == ["file path is not allowed: pipe.png"]


def test_a_fifo_that_reaches_the_open_is_refused_by_fstat(tree, monkeypatch):
    """The pre-open stat is bypassed (a file swapped for a FIFO): the open
    is non-blocking and fstat refuses it."""
    root, _ = tree
    os.mkfifo(os.path.join(root, "pipe.png"))
    monkeypatch.setattr(paths, "_is_regular", lambda path, reference: True)
    outcome: list[str] = []
    worker = threading.Thread(target=lambda: outcome.append(refused("pipe.png", root)),
                              daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "opening a FIFO blocked"
    assert outcome == ["file path is not allowed: pipe.png"]


def test_a_directory_and_a_socket_are_refused(tree):
    root, _ = tree
    assert refused("sub", root) == "file path is not allowed: sub"
    assert refused("/", root) == "file path is not allowed: /"  # the root itself
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(os.path.join(root, "s.png"))
        assert refused("s.png", root) == "file path is not allowed: s.png"
    finally:
        sock.close()


def test_the_byte_budget_bounds_the_read(tree):
    root, _ = tree
    assert read("cat.png", root, limit=len(CAT)) == CAT
    message = refused("cat.png", root, limit=len(CAT) - 1)
    assert "exceeds the media payload limit" in message

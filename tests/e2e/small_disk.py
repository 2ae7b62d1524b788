"""A small filesystem for the full-disk tests: ext4 on a loop device where
this process may make one (root, losetup, mkfs.ext4), else a tmpfs.

ext4 is the filesystem a server's slot files and logs really sit on
(delayed allocation, block groups, a journal); a tmpfs only refuses pages.
Every step that was done is undone (umount, losetup -d), whatever failed."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

LOOP_BYTES = 8 << 20   # ext4 leaves ~6 MiB of it for files
TMPFS_SIZE = "256k"


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, check=False)


def _why(done: subprocess.CompletedProcess) -> str:
    said = done.stderr.strip() or f"exit {done.returncode}"
    return said if said.startswith(done.args[0]) else f"{done.args[0]}: {said}"


class SmallDisk:
    """`path` (a mounted directory), `kind` ("ext4 on /dev/loopN" or "tmpfs"),
    `fallback` (why the loop device was not used; None when it was)."""

    def __init__(self, path: Path, kind: str, fallback: str | None) -> None:
        self.path, self.kind, self.fallback = path, kind, fallback


@contextlib.contextmanager
def _loop_ext4(image: Path, where: Path) -> Iterator[str]:
    """ext4 on a loop device over `image`, mounted at `where`; its device.
    Raises OSError (with the reason) where it cannot be made."""
    if os.geteuid() != 0:
        raise OSError("not root")
    for tool in ("losetup", "mkfs.ext4"):
        if shutil.which(tool) is None:
            raise OSError(f"no {tool}")
    with open(image, "wb") as f:
        f.truncate(LOOP_BYTES)
    done = _run("losetup", "--find", "--show", str(image))
    if done.returncode != 0:
        raise OSError(_why(done))
    device = done.stdout.strip()
    try:
        # -m 0: no blocks kept back for root (the server runs as root here too)
        for argv in (("mkfs.ext4", "-q", "-m", "0", device), ("mount", device, str(where))):
            done = _run(*argv)
            if done.returncode != 0:
                raise OSError(_why(done))
        (where / "lost+found").rmdir()   # an empty directory, as a tmpfs starts
        try:
            yield device
        finally:
            if _run("umount", str(where)).returncode != 0:
                _run("umount", "-l", str(where))   # busy: detached now, freed when let go
    finally:
        _run("losetup", "-d", device)   # on a lazily unmounted one: freed when it lets go
    left = _run("losetup", "--associated", str(image)).stdout.strip()
    assert not left, f"the loop device is still attached: {left}"


@contextlib.contextmanager
def _tmpfs(where: Path) -> Iterator[None]:
    done = _run("mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(where))
    if done.returncode != 0:
        raise OSError(_why(done))
    try:
        yield
    finally:
        _run("umount", "-l", str(where))


@contextlib.contextmanager
def small_disk(tmp: Path) -> Iterator[SmallDisk]:
    """A small mounted filesystem at `tmp`/disk (the loop image beside it).
    Raises OSError naming both reasons when neither can be mounted."""
    where = tmp / "disk"
    where.mkdir()
    with contextlib.ExitStack() as stack:
        try:
            device = stack.enter_context(_loop_ext4(tmp / "disk.img", where))
            disk = SmallDisk(where, f"ext4 on {device}", None)
        except OSError as loop_failed:
            try:
                stack.enter_context(_tmpfs(where))
            except OSError as tmpfs_failed:
                raise OSError(f"no loop device ({loop_failed}) and no tmpfs "
                              f"({tmpfs_failed})") from None
            disk = SmallDisk(where, f"tmpfs of {TMPFS_SIZE}", str(loop_failed))
        yield disk


def fill(where: Path) -> None:
    """Write until the disk is full (ENOSPC), down to its last byte: chunks
    shrink so that no partly free block is left (ext4's blocks here are 1 KiB)."""
    with open(where / "filler", "wb", buffering=0) as f:   # unbuffered: close cannot fail
        for chunk in (1 << 16, 1 << 12, 1):
            try:
                while f.write(b"\0" * chunk):
                    pass
            except OSError:
                pass

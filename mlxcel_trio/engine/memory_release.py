"""Giving freed memory back to the system: MLX's buffer cache, then the C
heap's free pages.

Theory: on the CPU backend every MLX buffer is a `malloc`.  glibc serves
the engine thread (and the threads MLX computes on) from arenas of its own,
chains of 64 MiB heaps, and once a large buffer has been freed it raises its
mmap threshold (up to 32 MiB), so from then on nearly every buffer lives in
those heaps: the slots' KV, every prompt-cache entry, a prefill's
activations.  Their sizes differ with every prompt and their lives overlap
(a cache entry outlives the activations allocated beside it), so a freed
buffer's pages mostly stay resident, held by the arena for a later malloc
of a size that may not come.  Left alone, resident memory rises for an hour
or more with no live array behind it (bench/README.md, the soak).
`malloc_trim(0)` walks every arena and hands each free chunk's whole pages
back (MADV_DONTNEED); it costs about what it frees (tens of ms a GiB), and a
page handed back costs a page fault when a later buffer reuses it.

MLX's own buffer cache (freed buffers it keeps for reuse: at most 32 MiB on
the CPU backend, up to its memory limit on Metal by default) is emptied
first, so its buffers reach the heap before the trim.  Where there is no
glibc (macOS) only that part runs.

When (engine/loop.py): each time the engine goes idle, and between two
steps while it computes at most every BUSY_EVERY_S, so a server that never
idles still gives its free pages back.  A step itself never pays: the busy
check is one clock read.  `Release` counts what it did; the counts reach
/metrics with MLX's figures (`MlxMemory`).
"""

from __future__ import annotations

import ctypes
import logging
import time

from .idle_sleep import resident_bytes

log = logging.getLogger("mlxcel.engine")

BUSY_EVERY_S = 30.0   # while the engine computes, at most this often


def libc_malloc_trim():
    """glibc's malloc_trim, or None where the C library has none."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


class Release:
    """The engine thread's releases and their totals (this thread's own)."""

    def __init__(self) -> None:
        self._trim = libc_malloc_trim()
        self.at = time.perf_counter()   # when the last release ran
        self.count = 0
        self.seconds = 0.0
        self.released = 0               # resident bytes before minus after, summed

    def __call__(self) -> int:
        """Empty MLX's buffer cache and trim the C heap; the resident bytes
        this gave back (may be <= 0 where the OS does not say)."""
        import mlx.core as mx

        t0 = time.perf_counter()
        before = resident_bytes()
        mx.clear_cache()
        if self._trim is not None:
            self._trim(0)
        gave = before - resident_bytes()
        self.at = now = time.perf_counter()
        self.count += 1
        self.seconds += now - t0
        self.released += max(gave, 0)
        log.debug("memory release: %.1f MiB back in %.2f ms", gave / 2**20, (now - t0) * 1e3)
        return gave

    def due(self, now: float) -> bool:
        """While computing: the last release is BUSY_EVERY_S old."""
        return now - self.at >= BUSY_EVERY_S

    def summary(self) -> str:
        """The load summary's line: MLX's buffer-cache limit (its default,
        read back: MLX has no getter) and when memory goes back."""
        import mlx.core as mx

        limit = mx.set_cache_limit(mx.get_memory_limit())
        mx.set_cache_limit(limit)
        heap = " and the C heap's free pages" if self._trim is not None else ""
        return (f"memory: MLX keeps up to {limit // 2**20} MiB of freed buffers; they{heap} "
                f"go back to the system each time the engine idles and every "
                f"{BUSY_EVERY_S:.0f} s while it computes")

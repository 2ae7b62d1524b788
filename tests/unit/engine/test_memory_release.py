"""The engine's memory release (engine/memory_release.py): freed MLX
buffers that the C heap kept resident go back to the system, and the
release counts what it did."""

from __future__ import annotations

import sys
import threading

import pytest

from mlxcel_trio.engine.idle_sleep import resident_bytes
from mlxcel_trio.engine.memory_release import Release, libc_malloc_trim

MIB = 1 << 20


@pytest.mark.skipif(not sys.platform.startswith("linux") or libc_malloc_trim() is None,
                    reason="glibc's malloc_trim")
def test_a_release_gives_back_what_a_fragmented_heap_kept():
    import mlx.core as mx

    got: dict = {}

    def fragment() -> None:   # a thread of its own, as the engine's: its own arena
        limit = mx.set_cache_limit(0)   # MLX's cache would keep what follows
        big = mx.zeros((16 * MIB // 4,)) + 1   # freed, it lifts glibc's mmap threshold
        mx.eval(big)
        del big
        mx.set_cache_limit(limit)
        arrays = []
        for i in range(240):   # 1-4 MiB buffers, every tenth kept: holes between them
            a = mx.zeros(((1 + i % 4) * MIB // 4,)) + i
            mx.eval(a)
            arrays.append(a)
        kept = arrays[::10]
        del arrays, a
        mx.clear_cache()
        got["freed_resident"] = resident_bytes()
        release = Release()
        got["gave"] = release()
        got["after"] = resident_bytes()
        got["release"] = release
        del kept

    thread = threading.Thread(target=fragment)
    thread.start()
    thread.join()
    release = got["release"]
    assert got["gave"] >= 100 * MIB, got     # ~540 MiB freed, held between the kept ones
    assert got["after"] <= got["freed_resident"] - 100 * MIB
    assert release.count == 1 and release.released == got["gave"] and release.seconds > 0

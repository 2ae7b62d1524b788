"""The disk tier on its own: each cache kind written and read back, the
index kept across instances, foreign layouts and damaged files skipped.

White-box in one test: the writer-thread test holds the module's file
writer to fill the write queue, which no public name can do."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

from mlxcel_trio.engine import cache_kinds
from mlxcel_trio.engine.cache_disk import DiskTier
from mlxcel_trio.engine.cache_kinds import layout_of
from mlxcel_trio.engine.prompt_cache import PromptCache


def layers(n: int) -> list:
    kv = KVCache()
    kv.keys = mx.arange(2 * n * 4, dtype=mx.float32).reshape(1, 2, n, 4)
    kv.values, kv.offset = kv.keys + 1, n
    rot = RotatingKVCache(max_size=4)
    rot.keys = mx.arange(2 * 4 * 4, dtype=mx.float32).reshape(1, 2, 4, 4)
    rot.values, rot.offset, rot._idx = rot.keys * 2, n, 4
    arr = ArraysCache(2)
    arr.cache = [mx.ones((1, 3, 8)) * n, None]
    return [kv, rot, arr]


def test_every_kind_round_trips_and_survives_a_new_instance(tmp_path):
    src = layers(10)
    disk = DiskTier(tmp_path, None)
    disk.open(layout_of(src))
    tokens = np.arange(10)
    disk.put("ns", tokens, src, cache_kinds.cuttable(src))
    disk.flush()
    again = DiskTier(tmp_path, None)
    again.open(layout_of(src))
    n, entry = again.best("ns", np.arange(12), 11)
    assert n == 10 and not entry.cuttable      # a full window and a recurrent state
    got = again.load(entry)
    for a, b in zip(cache_kinds.arrays_of(src), cache_kinds.arrays_of(got)):
        assert mx.array_equal(a, b)
    assert [type(c) for c in got] == [KVCache, RotatingKVCache, ArraysCache]
    assert got[1].offset == 10 and got[1].max_size == 4
    # a prompt that diverges inside the snapshot cannot use it
    assert again.best("ns", np.array([0, 1, 2, 99]), 3) is None


def test_another_layout_and_a_damaged_file_are_skipped(tmp_path, caplog):
    src = layers(6)
    disk = DiskTier(tmp_path, None)
    disk.open(layout_of(src))
    disk.put("ns", np.arange(6), src, False)
    disk.flush()
    other = DiskTier(tmp_path, None)
    other.open("kv,kv")
    assert other.stats()["entries"] == 0 and other.skipped == 1
    (path,) = tmp_path.glob("*.safetensors")
    raw = bytearray(path.read_bytes())
    raw[8 + int.from_bytes(raw[:8], "little") + 3] ^= 0xFF
    path.write_bytes(bytes(raw))
    pc = PromptCache(None, disk=DiskTier(tmp_path, None))
    pc.bind(src)
    assert pc.lookup("ns", list(range(8))) == (0, None)
    assert "checksum mismatch" in caplog.text


def test_the_budget_deletes_the_oldest_files(tmp_path):
    src = layers(6)
    one = DiskTier(tmp_path, None)
    one.open(layout_of(src))
    one.put("ns", np.arange(6), src, False)
    one.flush()
    size = one.nbytes
    disk = DiskTier(tmp_path, int(size * 1.5))
    disk.open(layout_of(src))
    disk.put("ns", np.arange(6) + 100, layers(6), False)
    disk.flush()
    assert disk.stats()["entries"] == 1 and len(list(tmp_path.glob("*.safetensors"))) == 1
    assert disk.best("ns", np.arange(100, 110), 9)[0] == 6   # the newer one stayed


def test_a_disk_hit_is_counted_by_tier(tmp_path):
    src = layers(6)
    pc = PromptCache(None, disk=DiskTier(tmp_path, None))
    pc.bind(src)
    assert pc.donate("ns", list(range(6)), src)
    pc.disk.flush()
    fresh = PromptCache(None, disk=DiskTier(tmp_path, None))
    fresh.bind(src)
    n, got = fresh.lookup("ns", list(range(9)))
    assert n == 6 and fresh.last_tier == "disk"
    st = fresh.stats()
    assert st["disk_hits"] == 1 and st["reused_disk"] == 6 and st["entries"] == 1
    n, _ = fresh.lookup("ns", list(range(9)))
    assert fresh.last_tier == "memory" and fresh.stats()["reused_memory"] == 6


def test_writes_run_on_the_writer_thread_and_a_full_queue_drops(tmp_path, monkeypatch):
    """put() only hands over: the file is written by the background writer
    (its thread, not the caller's), and a writer WRITE_QUEUE entries behind
    makes put() drop the entry instead of waiting for the disk."""
    import threading

    from mlxcel_trio.engine import cache_disk

    src = layers(6)
    disk = DiskTier(tmp_path, None)
    disk.open(layout_of(src))
    gate, writers = threading.Event(), []
    real = cache_disk._write_safetensors

    def held(f, head, views):
        writers.append(threading.current_thread().name)
        assert gate.wait(30), "the test never released the writer"
        return real(f, head, views)

    monkeypatch.setattr(cache_disk, "_write_safetensors", held)
    for i in range(cache_disk.WRITE_QUEUE + 3):   # one is taken by the writer, held
        disk.put("ns", np.arange(6) + 10 * i, src, False)
    st = disk.stats()
    assert st["entries"] == 0 and st["write_dropped"] >= 2, st
    gate.set()
    assert disk.flush(30)
    st = disk.stats()
    assert st["entries"] + st["write_dropped"] == cache_disk.WRITE_QUEUE + 3, st
    assert set(writers) == {"prompt-cache-disk-writer"}
    # what the writer wrote reads back through the index and the checksum
    again = DiskTier(tmp_path, None)
    again.open(layout_of(src))
    n, entry = again.best("ns", np.arange(8), 7)
    got = again.load(entry)
    assert n == 6 and got is not None
    for a, b in zip(cache_kinds.arrays_of(src), cache_kinds.arrays_of(got)):
        assert mx.array_equal(a, b)


def test_the_writer_keeps_bfloat16_and_quantized_arrays(tmp_path):
    from mlxcel_trio.engine.kv_cache import Codec, StoredKVCache
    from mlxcel_trio.protocol.kv_types import KV_CACHE_TYPES

    kv = KVCache()
    kv.keys = mx.random.normal((1, 2, 40, 32)).astype(mx.bfloat16)[..., :5, :]  # a view
    kv.values, kv.offset = kv.keys * 2, 5
    q = StoredKVCache(Codec(KV_CACHE_TYPES["q8_0"]), Codec(KV_CACHE_TYPES["q8_0"]))
    q.update_and_fetch(mx.random.normal((1, 2, 5, 32)), mx.random.normal((1, 2, 5, 32)))
    src = [kv, q]
    disk = DiskTier(tmp_path, None)
    disk.open(layout_of(src))
    disk.put("ns", np.arange(5), src, True)
    assert disk.flush(30)
    got = disk.load(disk.best("ns", np.arange(9), 8)[1])
    for a, b in zip(cache_kinds.arrays_of(src), cache_kinds.arrays_of(got)):
        assert a.dtype == b.dtype and mx.array_equal(a, b)


def test_a_quantized_global_layer_beside_a_full_window_round_trips(tmp_path):
    """-ctk q8_0 on a sliding-window model: the layout names each layer's
    kind (the window kept in float, the global layer stored in q8_0), and
    a file read back gives the same kinds, formats and arrays."""
    from mlxcel_trio.engine.kv_cache import Codec, StoredKVCache
    from mlxcel_trio.protocol.kv_types import KV_CACHE_TYPES

    q = StoredKVCache(Codec(KV_CACHE_TYPES["q8_0"]), Codec(KV_CACHE_TYPES["q8_0"]))
    q.update_and_fetch(mx.random.normal((1, 2, 10, 32)), mx.random.normal((1, 2, 10, 32)))
    src = [layers(10)[1], q]
    assert layout_of(src) == "rotating,stored:q8_0/q8_0"
    disk = DiskTier(tmp_path, None)
    disk.open(layout_of(src))
    disk.put("ns", np.arange(10), src, cache_kinds.cuttable(src))
    assert disk.flush(30)
    again = DiskTier(tmp_path, None)
    again.open(layout_of(src))
    n, entry = again.best("ns", np.arange(12), 11)
    assert n == 10 and not entry.cuttable
    got = again.load(entry)
    assert [type(c) for c in got] == [RotatingKVCache, StoredKVCache]
    assert got[1].bits == 8 and got[1].offset == 10 and got[0].offset == 10
    for a, b in zip(cache_kinds.arrays_of(src), cache_kinds.arrays_of(got)):
        assert a.dtype == b.dtype and mx.array_equal(a, b)
    # the same model at -ctk f16 has another layout: the file is not offered
    plain = DiskTier(tmp_path, None)
    plain.open("rotating,kv")
    assert plain.stats()["entries"] == 0

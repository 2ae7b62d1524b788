"""The disk tier on its own: each cache kind written and read back, the
index kept across instances, foreign layouts and damaged files skipped."""

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
    size = one.nbytes
    disk = DiskTier(tmp_path, int(size * 1.5))
    disk.open(layout_of(src))
    disk.put("ns", np.arange(6) + 100, layers(6), False)
    assert disk.stats()["entries"] == 1 and len(list(tmp_path.glob("*.safetensors"))) == 1
    assert disk.best("ns", np.arange(100, 110), 9)[0] == 6   # the newer one stayed


def test_a_disk_hit_is_counted_by_tier(tmp_path):
    src = layers(6)
    pc = PromptCache(None, disk=DiskTier(tmp_path, None))
    pc.bind(src)
    assert pc.donate("ns", list(range(6)), src)
    fresh = PromptCache(None, disk=DiskTier(tmp_path, None))
    fresh.bind(src)
    n, got = fresh.lookup("ns", list(range(9)))
    assert n == 6 and fresh.last_tier == "disk"
    st = fresh.stats()
    assert st["disk_hits"] == 1 and st["reused_disk"] == 6 and st["entries"] == 1
    n, _ = fresh.lookup("ns", list(range(9)))
    assert fresh.last_tier == "memory" and fresh.stats()["reused_memory"] == 6

"""The disk tier's writes (--cache-disk) and the engine thread: how long a
donation that the disk tier writes through holds the thread that decodes.
A benchmark, not a test: it prints numbers and never fails on them.

    python bench/cache_disk_write.py [--mib 4,32,128] [--repeat 3] [--json OUT]

For each entry size (one plain KV layer of that many MiB, float32) and
each way of writing it:

  inline      the previous implementation: mx.save_safetensors on the
              calling thread, then the file re-read for its checksum
  same-thread the current serializer (laid out over the arrays' buffers,
              hashed while written), on the calling thread
  background  the current DiskTier: put() hands the evaluated arrays to
              the writer thread and returns

`put` is the median time the calling (engine) thread spends in
DiskTier.put; `written` the median until the file is indexed (flush).
`step` is a decode-sized stand-in (a matmul chain of about 2 ms) run on
the calling thread right after put() returns, while the background writer
is still writing: its median against the same loop with no write in
flight says what the writer still takes from decoding (the GIL is released
while it writes and hashes; a 2-CPU machine shares its cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def _layers(mib: int):
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    n = mib * 1024 * 1024 // (2 * 8 * 128 * 4)   # K and V, 8 heads of 128, float32
    c = KVCache()
    c.keys = mx.random.normal((1, 8, n, 128))
    c.values = mx.random.normal((1, 8, n, 128))
    c.offset = n
    mx.eval(c.keys, c.values)
    return [c], n


def _inline_put(disk, ns, tokens, layers, cuttable) -> None:
    """The disk tier's put() before the writer thread (for the comparison)."""
    import os

    import mlx.core as mx

    from mlxcel_trio.engine import cache_disk

    tensors, meta = cache_disk.entry_tensors(ns, tokens, layers, cuttable)
    fd, tmp = tempfile.mkstemp(prefix=".write-", suffix=".safetensors", dir=disk.root)
    os.close(fd)
    mx.save_safetensors(tmp, tensors, metadata=meta)
    digest = cache_disk._sha256(Path(tmp))
    os.replace(tmp, disk.root / f"{digest}.safetensors")


def _step(x, w) -> float:
    import mlx.core as mx

    t = time.perf_counter()
    y = x
    for _ in range(8):
        y = mx.tanh(y @ w)
    mx.eval(y)
    return time.perf_counter() - t


def run(mib: int, repeat: int) -> list[dict]:
    import mlx.core as mx
    import numpy as np

    from mlxcel_trio.engine.cache_disk import DiskTier
    from mlxcel_trio.engine.cache_kinds import layout_of

    layers, n = _layers(mib)
    x, w = mx.random.normal((4, 512)), mx.random.normal((512, 512)) * 0.05
    mx.eval(x, w)
    for _ in range(20):
        _step(x, w)
    idle = statistics.median(_step(x, w) for _ in range(50))
    rows = []
    for mode in ("inline", "same-thread", "background"):
        puts, written, steps = [], [], []
        for r in range(repeat):
            with tempfile.TemporaryDirectory() as root:
                disk = DiskTier(root, None, background=(mode == "background"))
                disk.open(layout_of(layers))
                tokens = np.arange(n) + r   # other bytes each time: a real write
                t = time.perf_counter()
                if mode == "inline":
                    _inline_put(disk, "ns", tokens, layers, True)
                else:
                    disk.put("ns", tokens, layers, True)
                puts.append(time.perf_counter() - t)
                during = []
                while mode == "background" and disk._pending.unfinished_tasks > 0:
                    during.append(_step(x, w))
                disk.flush(120)
                written.append(time.perf_counter() - t)
                steps += during
        rows.append({"mib": mib, "mode": mode, "put_ms": 1e3 * statistics.median(puts),
                     "written_ms": 1e3 * statistics.median(written),
                     "step_idle_ms": 1e3 * idle,
                     "step_during_ms": 1e3 * statistics.median(steps) if steps else None,
                     "steps_during": len(steps)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", default="4,32,128")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    print(f"{'MiB':>5} {'mode':<12} {'put ms':>8} {'written ms':>10} {'step idle':>9} "
          f"{'step during':>11} {'n':>4}")
    for mib in (int(m) for m in args.mib.split(",")):
        for row in run(mib, args.repeat):
            rows.append(row)
            during = "-" if row["step_during_ms"] is None else f"{row['step_during_ms']:.2f}"
            print(f"{row['mib']:>5} {row['mode']:<12} {row['put_ms']:>8.1f} "
                  f"{row['written_ms']:>10.1f} {row['step_idle_ms']:>9.2f} {during:>11} "
                  f"{row['steps_during']:>4}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Router mode against the same model served directly.  A benchmark, not a
test: it prints numbers and never fails on them.

    python bench/router.py [--fixture bench | --model DIR] [--tokens 32]
                           [--streams 4] [--rounds 2]

One process each, the same checkpoint, the same slots: `mlxcel-server -m
MODEL -np N` and `mlxcel-server --models-dir D -np N` (D holds only MODEL,
linked in).  Per round, alternating which goes first:

  decode tok/s    one stream, then N streams at once (aggregate while all
                  decode), greedy, EOS ignored: through the router vs direct
                  (target >= 0.95x)
  TTFT            the router's first request for the unloaded model (a cold
                  load: the child starts and loads) vs a request once loaded
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import _common as C  # noqa: E402


def start_router(models_dir: Path, port: int, args: list[str], env: dict) -> subprocess.Popen:
    import httpx

    proc = subprocess.Popen([sys.executable, "-m", "mlxcel_trio", "--models-dir", str(models_dir),
                             "--port", str(port), *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    sys.exit("router did not start")


def measure(url: str, prompts, n: int, extra: dict) -> dict:
    import httpx

    with httpx.Client(timeout=None) as c:
        single = C.stream_completion(url, prompts[0], n, c, extra=extra)
    results = C.streams_at_once(url, prompts, n, extra)
    return {"single": C.single_rate(single["events"]),
            "batch": C.aggregate_rate([r["events"] for r in results]).get("rate")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--fixture", default="bench", choices=("bench", "tiny"))
    src.add_argument("--model", type=Path)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()

    from fixtures.build import ensure

    model = (a.model or ensure(a.fixture)).resolve()
    ids = C.vocab_ids(model)
    prompts = [C.make_prompt(ids, a.prompt_tokens, seed=i) for i in range(a.streams)]
    env = C.server_env("auto")
    slots = ["-np", str(a.streams), "-c", str(a.streams * (a.prompt_tokens + a.tokens + 64))]
    rows: dict = {"direct": [], "router": []}
    ttft: dict = {"cold": [], "loaded": []}
    with tempfile.TemporaryDirectory() as d:
        models_dir = Path(d)
        # a directory of links: a link to a directory outside would be skipped
        (models_dir / "m").mkdir()
        for f in model.iterdir():
            (models_dir / "m" / f.name).symlink_to(f)
        for r in range(a.rounds):
            order = ("direct", "router") if r % 2 == 0 else ("router", "direct")
            for side in order:
                port = C.free_port()
                url = f"http://127.0.0.1:{port}"
                if side == "direct":
                    proc = C.start_server(model, port, slots, env)
                    extra: dict = {}
                else:
                    proc = start_router(models_dir, port, slots, env)
                    extra = {"model": "m"}
                    import httpx

                    with httpx.Client(timeout=None) as c:
                        for key in ("cold", "loaded"):
                            t0 = time.perf_counter()
                            C.stream_completion(url, prompts[0], 1, c, extra=extra)
                            ttft[key].append(time.perf_counter() - t0)
                try:
                    rows[side].append(measure(url, prompts, a.tokens, extra))
                finally:
                    proc.terminate()
                    proc.wait(30)
                print(f"round {r + 1}: {side} {rows[side][-1]}", flush=True)
    med = {side: {k: C.median([x[k] for x in v]) for k in ("single", "batch")}
           for side, v in rows.items()}
    print(f"model {model} | {a.tokens} tokens, {a.streams} streams, {a.rounds} rounds (medians)")
    for k, label in (("single", "1 stream"), ("batch", f"{a.streams} streams")):
        d, r = med["direct"][k], med["router"][k]
        print(f"{label:>10}: direct {d:8.2f} tok/s, router {r:8.2f} tok/s = {r / d:.3f}x "
              "(target >= 0.95x)")
    print(f"TTFT through the router: cold load {C.median(ttft['cold']):.2f} s, loaded "
          f"{C.median(ttft['loaded']):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Image requests: their latency, and what they cost the text streams beside
them (not a test).

    python bench/images.py                     # tiny-vlm fixture, ~1 min
    python bench/images.py --model DIR [--rounds 5] [--tokens 32]

One server (`-np 4`) on one checkpoint, in one run:

| row | what |
|---|---|
| image request | `POST /completion` with one image (`multimodal_data`) and a short text, `--tokens` greedy tokens: wall latency, and the server's own prompt_ms (encode + prefill) and predicted_ms |
| same prompt, no image | the same request with the image's placeholder run replaced by ordinary text tokens of the same count: what the image itself adds |
| 3 text streams alone / beside images | aggregate decode tok/s of three streaming text requests, alone, while image requests arrive back to back, and while the same requests arrive without their image; the last two's ratio is the image path's own effect on concurrent text |

Medians over --rounds.  The image is a random RGB picture of --size pixels,
decoded and resized by the server as any client's would be.
"""

from __future__ import annotations

import argparse
import base64
import io
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as C

MARKER = "<__media__>"
TEXT = "Describe what you see in this picture, in one short sentence."


def png(size: int, seed: int) -> str:
    from PIL import Image

    rgb = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def one(client: httpx.Client, url: str, body: dict) -> dict:
    t0 = time.perf_counter()
    r = client.post(url + "/completion", json=body, timeout=600)
    r.raise_for_status()
    out = r.json()
    t = out.get("timings", {})
    return {"wall_ms": 1e3 * (time.perf_counter() - t0), "prompt_ms": t.get("prompt_ms"),
            "predicted_ms": t.get("predicted_ms"), "n_prompt": t.get("prompt_n")}


def text_streams(url: str, prompts: list[list[int]], n: int) -> float | None:
    results = C.streams_at_once(url, prompts, n)
    return C.aggregate_rate([r["events"] for r in results]).get("rate")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--size", type=int, default=336, help="the picture's side, pixels")
    ap.add_argument("--blas", default="auto")
    args = ap.parse_args(argv)
    if args.model is None:
        from fixtures.build import ensure
        args.model = ensure("tiny-vlm")
    env = C.server_env(args.blas)
    port = C.free_port()
    url = f"http://127.0.0.1:{port}"
    proc = C.start_server(args.model, port, ["-np", "4", "-c", "8192", "--cache-ram", "0"], env)
    try:
        with httpx.Client() as client:
            props = client.get(url + "/props").json()
            if not props.get("modalities", {}).get("vision"):
                sys.exit(f"{args.model} takes no images (modalities: {props.get('modalities')})")
            prompt = f"{MARKER}\n{TEXT}"
            image_rows, text_rows = [], []
            for k in range(args.rounds + 1):  # the first round warms up
                body = {"prompt": {"prompt_string": prompt, "multimodal_data": [png(args.size, k)]},
                        "n_predict": args.tokens, "temperature": 0, "ignore_eos": True,
                        "cache_prompt": False}
                row = one(client, url, body)
                # the same length of ordinary text in the image's place
                ids = client.post(url + "/tokenize", json={"content": TEXT}).json()["tokens"]
                n_fill = max(1, row["n_prompt"] - len(ids) - 1)
                filler = C.make_prompt(C.vocab_ids(args.model), n_fill, seed=k)
                plain = one(client, url, {"prompt": [*filler, *ids], "n_predict": args.tokens,
                                          "temperature": 0, "ignore_eos": True,
                                          "cache_prompt": False})
                if k:
                    image_rows.append(row)
                    text_rows.append(plain)
            vocab = C.vocab_ids(args.model)
            prompts = [C.make_prompt(vocab, 32, seed=100 + i) for i in range(3)]
            alone = [text_streams(url, prompts, args.tokens * 4) for _ in range(args.rounds)]
            filler = C.make_prompt(vocab, n_fill, seed=999)

            def beside(with_image: bool) -> list:
                stop = threading.Event()

                def back_to_back() -> None:
                    with httpx.Client() as c:
                        k = 1000
                        while not stop.is_set():
                            p = ({"prompt_string": prompt, "multimodal_data": [png(args.size, k)]}
                                 if with_image else [*filler, *ids])
                            one(c, url, {"prompt": p, "n_predict": 4, "temperature": 0,
                                         "cache_prompt": False})
                            k += 1

                side = threading.Thread(target=back_to_back)
                side.start()
                try:
                    return [text_streams(url, prompts, args.tokens * 4)
                            for _ in range(args.rounds)]
                finally:
                    stop.set()
                    side.join()

            with_images, with_texts = beside(True), beside(False)
    finally:
        proc.terminate()
        proc.wait(60)

    def med(rows, key):
        return C.median([r[key] for r in rows if r[key] is not None])

    print(f"model {args.model} | {args.size}x{args.size} picture | {args.tokens} tokens | "
          f"{args.rounds} rounds | prompt {image_rows[0]['n_prompt']} tokens")
    print(f"{'row':34} {'wall ms':>9} {'prompt ms':>10} {'predicted ms':>13}")
    for name, rows in (("image request", image_rows), ("same prompt, no image", text_rows)):
        print(f"{name:34} {med(rows, 'wall_ms'):9.1f} {med(rows, 'prompt_ms'):10.1f} "
              f"{med(rows, 'predicted_ms'):13.1f}")
    extra = med(image_rows, "prompt_ms") - med(text_rows, "prompt_ms")
    print(f"the image adds {extra:.1f} ms to the prompt phase "
          f"({med(image_rows, 'wall_ms') / med(text_rows, 'wall_ms'):.2f}x wall)")
    a, b, c = (C.median([x for x in xs if x]) for xs in (alone, with_images, with_texts))
    print(f"3 text streams: {a:.1f} tok/s alone, {b:.1f} beside image requests ({b / a:.2f}x), "
          f"{c:.1f} beside the same requests without the image ({c / a:.2f}x); the image's "
          f"own share: {b / c:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

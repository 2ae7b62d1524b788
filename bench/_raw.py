"""Raw mlx-lm side of bench/throughput.py, run in its own process.

    python bench/_raw.py SPEC.json

SPEC holds {"model", "warmup_prompt", "single_prompt", "batch_prompts":
{"4": [...], "8": [...]}, "tokens", "eos": "ban" | "ignore"}.  The worker loads the checkpoint with
`mlx_lm.load`, runs one greedy `stream_generate` (EOS ignored, like the
server's `ignore_eos`: EOS banned by default) and then mlx-lm's own `BatchGenerator` for each batch,
with per-token timestamps, and prints one line `RESULT {json}` on stdout.
Its VmHWM is read at the end, so it covers exactly this workload.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    t_start = time.perf_counter()
    rss_boot = C.proc_status()
    import mlx.core as mx
    from mlx_lm import load, stream_generate
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_logits_processors, make_sampler

    rss_imports = C.proc_status()
    t0 = time.perf_counter()
    model, tok = load(spec["model"])
    load_s = time.perf_counter() - t0
    # The server side runs with ignore_eos, which (as upstream) bans every
    # end-of-generation token.  "ban" does the same with mlx-lm's own
    # logit_bias processor, so both sides produce the same tokens and do the
    # same work; "ignore" only stops mlx-lm from ending at EOS.
    eos = sorted(tok.eos_token_ids)
    tok.eos_token_ids = set()
    procs = (make_logits_processors(logit_bias={t: float("-inf") for t in eos})
             if spec.get("eos", "ban") == "ban" and eos else [])
    greedy = make_sampler(temp=0.0)
    n_tokens = spec["tokens"]

    import os
    main_tid = os.getpid()
    cpu: dict = {}

    def single(prompt, max_tokens):
        events, ids = [], []
        t_send = time.perf_counter()
        for r in stream_generate(model, tok, prompt, max_tokens=max_tokens, sampler=greedy,
                                   logits_processors=procs or None):
            now = time.perf_counter()
            ids.append(r.token)
            events.append((now - t_send, r.generation_tokens))
        return {"events": events, "tokens": ids, "prompt_n": len(prompt)}

    # Warm-up: the same prompt length and a few tokens, as the server's own
    # warm-up plus the driver's warm-up request give the server side.
    single(spec["warmup_prompt"], 4)

    c0 = C.thread_cpu()
    result: dict = {"load_s": load_s, "single": single(spec["single_prompt"], n_tokens),
                    "batch": {}, "cpu": cpu}
    cpu["single"] = C.cpu_delta(c0, C.thread_cpu(), main_tid)
    for key, prompts in spec["batch_prompts"].items():
        c0 = C.thread_cpu()
        gen = BatchGenerator(model, sampler=greedy)  # batch_generate's defaults
        t_send = time.perf_counter()
        uids = gen.insert(prompts, [n_tokens] * len(prompts),
                          logits_processors=[list(procs) for _ in prompts])
        events = {u: [] for u in uids}
        ids = {u: [] for u in uids}
        while responses := gen.next_generated():
            now = time.perf_counter() - t_send
            for r in responses:
                ids[r.uid].append(r.token)
                events[r.uid].append((now, len(ids[r.uid])))
        gen.close()
        result["batch"][key] = {"events": [events[u] for u in uids],
                                "tokens": [ids[u] for u in uids],
                                "wall_s": time.perf_counter() - t_send}
        cpu[key] = C.cpu_delta(c0, C.thread_cpu(), main_tid)
        del gen
    result["memory_kib"] = {"boot": rss_boot, "after_imports": rss_imports,
                            "end": C.proc_status()}
    result["mlx_peak_memory_bytes"] = mx.get_peak_memory()
    result["blas"] = C.blas_in_use()
    result["env"] = C.blas_vars()
    result["eos"] = {"ids": eos, "mode": spec.get("eos", "ban")}
    result["total_s"] = time.perf_counter() - t_start
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

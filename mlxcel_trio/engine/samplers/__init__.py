"""llama.cpp's sampler chain on MLX, vectorized over the batch.

Layout:

    chain.py      the truncation filters, temperature and the draw, one
                  function per upstream stage over [rows, candidates] arrays
    mirostat.py   Mirostat 1 and 2 (they replace the chain while active)
    history.py    the stages that read a sequence's token history on the raw
                  logits: logit bias, repetition penalties, DRY
    batch.py      per-sequence state, the logits processor every sampled row
                  runs, and the one sampler object the whole batch shares

See engine/sampling.py for how a job chooses between greedy and the chain.
"""

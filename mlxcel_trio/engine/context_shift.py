"""Context shift: upstream's retained-token arithmetic, and the one mlx-lm seam
the scheduler needs to apply it.

Theory of operation.  llama-server (with --context-shift) makes room before
it decodes a token that would fill the slot's last KV cell: it keeps the
first `n_keep` cells, drops the next `n_discard`, and slides the rest down
(`seq_rm` + `seq_add`, which re-rotates the surviving keys).  `window` is
that arithmetic, exactly as server-context.cpp's pre_decode computes it;
`retained` applies it to a token list.

mlx-lm keeps keys after RoPE and has no re-rotation primitive, so the
scheduler recomputes the KV of the retained window instead: it takes the
sequence out of the BatchGenerator and inserts the retained tokens plus the
already-sampled next token as a fresh prompt, keeping the sequence's own
sampler state, stop matcher, detokenizer and counters.  The retained tokens
are the ones upstream keeps; their KV differs numerically (see
docs/context.md).  `pending_token` reads that already-sampled token: mlx-lm
draws token k+1 while it hands out token k, and upstream decodes exactly
that draw at the shifted position.
"""

from __future__ import annotations

from typing import Sequence

# upstream: n_keep = std::min(slot.n_ctx - 4, n_keep)
KEEP_MARGIN = 4


def window(n_tokens: int, n_ctx: int, n_keep: int, n_discard: int, n_prompt: int,
           add_bos: bool) -> tuple[int, int]:
    """(n_keep, n_discard) upstream's pre_decode computes for a slot holding
    `n_tokens` KV cells of `n_ctx`.

    `n_keep` / `n_discard` are the request's values (-1 keeps the whole
    prompt of `n_prompt` tokens; n_discard 0 means half of what is not
    kept).  One cell is added to n_keep when the tokenizer prepends a BOS,
    whatever n_keep was, as upstream does.
    """
    keep = n_prompt if n_keep < 0 else n_keep
    if add_bos:
        keep += 1
    keep = min(n_ctx - KEEP_MARGIN, keep)
    n_left = n_tokens - keep
    # C++ integer division truncates toward zero
    discard = n_discard if n_discard else int(n_left / 2)
    discard = max(0, min(discard, max(0, n_left - 1)))
    return keep, discard


def retained(tokens: Sequence[int], n_keep: int, n_discard: int) -> list[int]:
    """The tokens a shift keeps: [0, n_keep) and [n_keep + n_discard, end)."""
    keep = max(0, n_keep)  # a context under 4 cells: nothing sensible to pin
    return [*tokens[:keep], *tokens[keep + n_discard:]]


def pending_token(generator, uid: int) -> int | None:
    """The token mlx-lm already drew for sequence `uid` and will hand out on
    the next step, or None when the sequence is not decoding."""
    batch = generator._generation_batch
    try:
        i = batch.uids.index(uid)
    except ValueError:
        return None
    return int(batch._next_tokens[i].item())


def history_processors(processors: list, history: Sequence[int], cut: int) -> list:
    """`processors` fed the sequence's whole history instead of the shifted
    window mlx-lm replays: mlx-lm passes the tokens of the re-inserted
    prompt (`cut` of them, ending with the pending token) plus each new one;
    the processors see `history` (prompt and every generated token, ending
    with that same pending token) plus the new ones.  Upstream's penalty /
    DRY / grammar state never sees a shift."""
    if not processors:
        return []
    import mlx.core as mx

    head = mx.array(list(history), dtype=mx.int32)

    def wrap(proc):
        return lambda context, logits: proc(mx.concatenate([head, context[cut:]]), logits)
    return [wrap(p) for p in processors]

"""Whether a drafter's inputs are usable, checked before the model loads: a
draft checkpoint must share the target's vocabulary, as upstream requires
of its draft models, and an ngram-cache lookup file must parse.

Read from the checkpoints' tokenizer.json and config.json only (no
tokenizer library, no weights), so the check runs before anything loads.
Upstream's rule: vocabulary sizes within 128 of each other and every token
text from id 5 on the same where both have it; both also start and end
sequences with the same ids.
"""

from __future__ import annotations

import json
from pathlib import Path

MAX_SIZE_DIFFERENCE = 128
CHECK_FROM_ID = 5
WORDING = "draft model vocab must match target model to use speculation"


def _texts(path: Path) -> dict[int, str]:
    tok = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = dict((tok.get("model") or {}).get("vocab") or {})
    if isinstance(vocab, list):  # unigram: [[piece, score], ...]
        table = {i: piece for i, (piece, _) in enumerate(vocab)}
    else:
        table = {i: t for t, i in vocab.items()}
    for added in tok.get("added_tokens") or ():
        table[int(added["id"])] = added["content"]
    return table


def _config(path: Path) -> dict:
    try:
        return json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _eos(config: dict) -> tuple[int, ...]:
    eos = config.get("eos_token_id")
    return tuple(sorted(eos)) if isinstance(eos, list) else (() if eos is None else (eos,))


def vocab_problem(target: str | Path, draft: str | Path) -> str | None:
    """Why the draft cannot serve the target (one clause), or None."""
    target, draft = Path(target), Path(draft)
    try:
        t, d = _texts(target), _texts(draft)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{WORDING}, and the draft's tokenizer.json could not be read ({exc})"
    n_t = int(_config(target).get("vocab_size") or len(t))
    n_d = int(_config(draft).get("vocab_size") or len(d))
    if abs(n_t - n_d) > MAX_SIZE_DIFFERENCE:
        return (f"{WORDING}: the target has {n_t} tokens and the draft {n_d}, "
                f"more than {MAX_SIZE_DIFFERENCE} apart")
    for i in range(CHECK_FROM_ID, min(max(t, default=0), max(d, default=0)) + 1):
        if t.get(i) != d.get(i):
            return f"{WORDING}: token {i} is {t.get(i)!r} in the target and {d.get(i)!r} in the draft"
    if _eos(_config(target)) != _eos(_config(draft)):
        return f"{WORDING}: the end-of-generation tokens differ"
    return None


def lookup_cache_problem(path: str) -> str | None:
    """Why an ngram-cache lookup file cannot be used, or None.  The file is
    parsed in full (upstream aborts on a bad one at startup, so do we, but
    before the model loads)."""
    from mlxcel_trio.protocol.lookup_cache import CacheFileError, load_table

    try:
        load_table(path)
    except OSError as exc:
        return f"failed to open lookup cache ({exc.strerror})"
    except CacheFileError as exc:
        return f"not a lookup cache file ({exc})"
    return None

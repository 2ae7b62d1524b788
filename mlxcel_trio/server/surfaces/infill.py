"""POST /infill: fill-in-the-middle over the native completion path.

The prompt is built the way llama-server builds it: an optional repo-level
context (FIM_REP "myproject", each input_extra chunk after FIM_SEP and its
filename, or a "--- snippet ---" separator when the vocabulary has no
FIM_SEP), then FIM_PRE prefix prompt, FIM_SUF suffix (swapped with
--spm-infill), FIM_MID.  Text fields are tokenized with special-token
parsing OFF, so a marker spelled inside a file stays literal text.  The
prefix keeps its last 3/4 of a batch, the suffix its first quarter (less the
prompt), and the extra context fills what the slot has left, as upstream.
"""

from __future__ import annotations

from functools import partial

from typing import Any

from quart import Response

from . import completion as native
from ..request.served import Served, off_loop
from ..http.errors import ApiError, json_type_name, type_error

SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"


def _check(body: Any, vocab) -> list[dict]:
    missing = "".join(f"{role} token is missing. " for role, name in
                      (("prefix", "pre"), ("suffix", "suf"), ("middle", "mid"))
                      if vocab.fim[name] is None)
    if missing:
        raise ApiError(f"Infill is not supported by this model: {missing}", "not_supported_error")
    if not isinstance(body, dict):
        raise ApiError(f"[json.exception.type_error.306] cannot use value() with "
                       f"{json_type_name(body)}")
    for key in ("input_prefix", "input_suffix"):
        if key not in body:
            # upstream means this 400 but does not return after setting it, so
            # its client gets a 500 out_of_range; we send the 400
            raise ApiError(f'"{key}" is required')
    for key in ("input_prefix", "input_suffix"):
        # upstream's tokenize_mixed: a string, or an array of strings and ids
        value = body[key]
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) or (isinstance(value, list) and not isinstance(item, bool)
                                         and isinstance(item, (int, float))):
                continue
            want = "number" if isinstance(value, list) else "string"
            raise type_error(want, item)
    extra = body.get("input_extra", [])
    if "input_extra" in body and not isinstance(extra, list):
        raise ApiError('"input_extra" must be an array of {"filename": string, "text": string}')
    for chunk in extra:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise ApiError('extra_context chunk must contain a "text" field with a string value')
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise ApiError('extra_context chunk\'s "filename" field must be a string')
    return extra


def build_prompt(vocab, body: dict, extra: list[dict], *, n_batch: int, n_predict: int,
                 n_ctx: int, spm: bool) -> list[int]:
    text = lambda s: vocab.tokenize(s, add_special=False, parse_special=False)  # noqa: E731
    fim = vocab.fim
    prompt = body.get("prompt")
    prompt_ids = text(prompt) if isinstance(prompt, str) else []  # a non-string is ignored upstream
    prefix = vocab.tokenize_mixed(body["input_prefix"], add_special=False, parse_special=False)
    suffix = vocab.tokenize_mixed(body["input_suffix"], add_special=False, parse_special=False)

    extra_ids: list[int] = []
    if fim["rep"] is not None:
        extra_ids += [fim["rep"], *text("myproject\n")]
    for chunk in extra:
        if fim["sep"] is not None:
            extra_ids += [fim["sep"], *text(chunk.get("filename", "tmp") + "\n")]
        else:
            extra_ids += text(SNIPPET_SEPARATOR)
        extra_ids += text(chunk["text"])
    if fim["sep"] is not None:
        extra_ids += [fim["sep"], *text("filename\n")]

    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt_ids))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_ids))
    head = [fim["pre"], *prefix[len(prefix) - n_prefix:], *prompt_ids]
    tail = [fim["suf"], *suffix[:n_suffix]]
    first, second = (tail, head) if spm else (head, tail)
    bos = [vocab.bos_id] if vocab.add_bos else []
    return [*extra_ids[len(extra_ids) - n_extra:], *bos, *first, *second, fim["mid"]]


async def infill(served: Served, body: Any) -> Response:
    vocab = served.bridge.vocab
    extra = _check(body, vocab)
    prompt = await off_loop(served, partial(
        build_prompt, vocab, body, extra, n_batch=served.batch_size,
        n_predict=served.n_predict_cap, n_ctx=served.bridge.info.n_ctx_slot,
        spm=served.spm_infill))
    return await native.complete(served, {**body, "prompt": prompt})

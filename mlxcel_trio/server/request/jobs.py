"""From a completion request body to engine jobs, and the shared response parts.

Parse at the edge: the body is structured into a frozen `NativeRequest`
(server/request/schema.py, generated from the native field table), the
prompt is tokenized, and the engine receives a typed `Job`.  The renderers
for the native shape and the OpenAI shape both read the same resolved record
and the same `Finished` record.
"""

from __future__ import annotations

import hashlib
import time
from typing import TYPE_CHECKING, Any, Sequence

import attrs

from ...protocol.records import Failed, Finished, Job, PromptTooLong
from ...protocol.speculative import SpecRequest
from ..http.errors import ApiError, json_type_name
from ..http.request_tape import taped
from . import (
    budget_fields as reasoning_budget,
)
from . import (
    grammar_fields as grammar,
)
from . import (
    sampler_fields as sampling,
)
from .schema import TABLE_DEFAULTS, NativeRequest
from .served import Served

if TYPE_CHECKING:
    from ..state import AppState


def server_defaults(config, vocab) -> NativeRequest:
    """The record of an empty request: every server-wide field default (see
    server/request/sampler_fields.py), plus the server's grammar (--grammar /
    --json-schema); the table's default where the server sets nothing.
    `verbose` (the OpenAI shapes' __verbose) defaults on with upstream's
    verbosity above 9: -v, or -lv 10 and up."""
    return attrs.evolve(TABLE_DEFAULTS, **sampling.server_defaults(config, vocab),
                        grammar_spec=grammar.default_spec(config),
                        cache_prompt=config.cache_prompt, n_keep=config.n_keep,
                        n_cache_reuse=config.cache_reuse,
                        verbose=config.verbose or config.log_verbosity > 9)


# -- prompts --------------------------------------------------------------------

def _is_token(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _single_prompt(p) -> bool:
    """A string, an array of ids, or an array mixing strings and ids."""
    if isinstance(p, str):
        return True
    if isinstance(p, list) and p and all(_is_token(x) or isinstance(x, str) for x in p):
        return any(_is_token(x) for x in p)
    return False


_BAD_PROMPT = ('"prompt" elements must be a string, a list of tokens, a JSON object '
               'containing a prompt string, or a list of mixed strings & tokens.')


def _tokenize_one(p, vocab, limit: int | None = None, vision=None, media=None,
                  audio=None) -> list[int]:
    if isinstance(p, dict):
        text = p.get("prompt_string")
        if not isinstance(text, str):
            raise ApiError(_BAD_PROMPT)
        if "multimodal_data" in p:
            if vision is None and audio is None:
                raise ApiError("Multimodal data provided, but model does not support "
                               "multimodal requests.")
            return _multimodal(text, p["multimodal_data"], vocab, vision, media, audio)
        p = text
    if not _single_prompt(p):
        raise ApiError(_BAD_PROMPT)
    if isinstance(p, str):  # text only: its ids are in the vocabulary by construction
        return tokenize_within(vocab, p, True, limit)
    return vocab.tokenize_mixed(p, add_special=True, parse_special=True)


def _multimodal(text: str, files, vocab, vision, policy, audio=None) -> list[int]:
    """A prompt_string whose media markers take the base64 `files` in order
    (upstream's multimodal_data), as ids with each item's placeholders: a
    file whose bytes are a WAV, MP3 or FLAC container is a clip (on a model
    that takes audio), any other an image."""
    from ...media.audio import container_of
    from .media_input import check_count, decode_audio, decode_base64, decode_image, place

    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise ApiError(_BAD_PROMPT)
    if policy is None:
        from ...media import MediaPolicy
        policy = MediaPolicy()
    check_count(len(files), policy)
    items = []
    for f in files:
        data = decode_base64(f, policy)
        if audio is not None and container_of(data) is not None:
            items.append(decode_audio(data))
        elif vision is None:
            raise ApiError("image input is not supported - hint: the loaded checkpoint takes "
                           "audio; its image tower is not loaded by this server",
                           "not_supported_error")
        else:
            items.append(decode_image(data))
    return place(text, policy.marker, items, vision,
                 lambda piece, add: vocab.tokenize(piece, add, True), add_special=True,
                 audio=audio)


def tokenize_within(vocab, text: str, add_special: bool, limit: int | None) -> list[int]:
    """`text`'s ids, or the engine's refusal of a prompt its slot cannot hold
    (`limit`: the slot's context) given on the count alone, before a list of
    millions of ids is built."""
    try:
        return vocab.tokenize(text, add_special, True, limit=limit)
    except PromptTooLong as exc:
        raise ApiError.from_failed(Failed.exceeds_context(0, exc.n_tokens, limit or 0)) from None


def tokenize_prompts(body: dict, vocab, limit: int | None = None,
                     vision=None, media=None, audio=None) -> list[list[int]]:
    """Every prompt of a completion body; `limit` (the slot's context):
    see tokenize_within; `vision`: the image input the server takes (None:
    multimodal_data is refused); `media`: the app's MediaPolicy (its bounds);
    `audio`: the audio input the chat model takes (None: no clips)."""
    if "prompt" not in body:
        raise ApiError("[json.exception.out_of_range.403] key 'prompt' not found")
    prompt = body["prompt"]
    if isinstance(prompt, list) and not prompt:
        raise ApiError('"prompt" must not be empty')
    if _single_prompt(prompt) or isinstance(prompt, dict):
        return [_tokenize_one(prompt, vocab, limit, vision, media, audio)]
    if isinstance(prompt, list):
        return [_tokenize_one(p, vocab, limit, vision, media, audio) for p in prompt]
    raise ApiError(_BAD_PROMPT)


# -- jobs ------------------------------------------------------------------------

def resolve(body: Any, served: Served) -> NativeRequest:
    """The body's record: the field table, then the custom handlers (each
    returns a new record), then the server's -n for a request's -1."""
    if not isinstance(body, dict):
        raise ApiError("[json.exception.type_error.306] cannot use value() with "
                       f"{json_type_name(body)}")
    rec = served.converter.structure(body, NativeRequest)
    rec = sampling.resolve(body, rec, served)
    sampling.check(rec)
    rec = grammar.resolve(body, rec, served)
    # the LoRA scales this request runs with, fixed now (server/adapters.py)
    rec = attrs.evolve(rec, lora=served.state.adapters.request_scales(body))
    server_n = served.n_predict_cap
    if rec.n_predict == -1 and server_n != -1:
        # upstream's rule: the request's own limit takes priority over -n,
        # and -1 (unlimited) falls back to it
        rec = attrs.evolve(rec, n_predict=server_n)
    return rec


def cache_namespace(served: Served, values: NativeRequest,
                    template: str | None = None) -> str | None:
    """The prompt-cache namespace for a request, None when it opted out
    (cache_prompt: false).  Raw-prompt routes share one namespace; a chat
    route's is keyed by the template in force, so a raw prompt never adopts
    a chat-rendered prefix (nor one template's rendering another's)."""
    if not values.cache_prompt:
        return None
    kind = "raw" if template is None else (
        "chat:" + hashlib.sha256(template.encode()).hexdigest()[:16])
    return namespace(served.bridge.info.path, kind)


def namespace(model_path: str, kind: str) -> str:
    """A prompt-cache namespace: the model identity, then the prompt kind."""
    return f"{model_path}\0{kind}"


def namespace_kind(ns: str | None) -> str | None:
    """The prompt kind of a namespace (what a slot file records)."""
    return None if ns is None else ns.split("\0", 1)[1]


def make_job(served: Served, values: NativeRequest, prompt: list[int], copy: int = 0,
             cache_ns: str | None = None) -> Job:
    """One engine job.  Copies after the first (n_cmpl > 1) take any free slot
    and, when seeded, seed + copy, as upstream's child tasks do."""
    seed = values.seed
    if copy and seed != 0xFFFF_FFFF:
        seed = (seed + copy) & 0xFFFF_FFFF
    return Job(
        id=served.bridge.next_job_id(),
        prompt=tuple(prompt),
        n_predict=values.n_predict,
        sampling=sampling.params(values, seed),
        grammar=grammar.compiled(served, values),
        stop=tuple(values.stop),
        ignore_eos=values.ignore_eos,
        id_slot=-1 if copy else values.id_slot,
        n_indent=values.n_indent,
        t_max_predict_ms=values.t_max_predict_ms,
        n_keep=values.n_keep,
        n_discard=values.n_discard,
        shared_prompt=values.n_cmpl > 1,
        return_progress=values.return_progress and values.stream,
        cache_ns=cache_ns,
        n_cache_reuse=values.n_cache_reuse,
        lora=values.lora or (),
        settings=values,
        speculative=(SpecRequest(spec.n_max, spec.n_min, spec.p_min)
                     if (spec := served.speculative).on else None),
        images=tuple(getattr(prompt, "images", ())),  # media_input.MediaPrompt
        audio=tuple(getattr(prompt, "audio", ())),
    )


def make_jobs(served: Served, values: NativeRequest, prompts: list[list[int]], body: dict,
              control: bool = False, template: str | None = None) -> list[Job]:
    """Every prompt times n_cmpl; a job's result index is its list position
    (prompt i's copies are i * n_cmpl .. i * n_cmpl + n_cmpl - 1).  The
    native reasoning_budget_* fields wrap the grammar when they ask for a
    budget (`control`: the route armed the request's realtime control).
    `template` is the chat template that rendered the prompt (None: a raw
    prompt); it keys the prompt-cache namespace."""
    n = values.n_cmpl
    ns = cache_namespace(served, values, template)
    jobs = [make_job(served, values, p, copy, ns) for p in prompts for copy in range(n)]
    return reasoning_budget.native_jobs(served.bridge.vocab, values, body, jobs, control)


async def run_all(served: Served, jobs: Sequence, result: type = Finished,
                  what: str = "generation") -> list:
    """Non-streaming: every job's final `result` record (Finished, or an
    embedding job's Embedded), in job order (a disconnect cancels us, and
    closing the handle cancels what is still running)."""
    results: dict[int, Any] = {}
    async with served.bridge.submit(*jobs) as events:
        async for ev in events:
            if isinstance(ev, result):
                results[ev.job_id] = ev
            elif isinstance(ev, Failed):
                raise ApiError.from_failed(ev)
    if len(results) != len(jobs):
        raise ApiError(f"{what} ended without a result", "server_error")
    return [results[job.id] for job in jobs]


# -- shared renderers (generation_settings / reduced_settings: settings.py) ------------

def now_s() -> int:
    return taped(lambda: int(time.time()))   # a continued stream's first process's time

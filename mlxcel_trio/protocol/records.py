"""Frozen records that cross the engine boundary: the server <-> engine protocol.

Commands go into the engine (`Submit`, `Cancel`, `ForceEnd`, `SlotAction`,
`ClearPromptCache`, `Wake`, `Shutdown`); events come out, one `StepEvents` batch per
engine step (`Loaded`, `Started`, `PromptProgress`, `TokenPiece`,
`Finished`, `Failed`, `SlotFreed`, `CacheStats`, `EngineStats`, `MlxMemory`, and
`Sleeping` / `Woke` around an idle sleep; `Embedded` for an `EmbedJob`,
`TranscriptPiece` / `Transcribed` for a `TranscribeJob`).  All of them are immutable so
that the trio side can read them without locks once they have been handed
over; what the engine counts reaches trio only as such events.

Two things ride on a `Job` without being records: its grammar (shared,
read-only; `start` gives the engine a per-sequence `Constraint` that only
the engine thread touches) and its settings (the server's own record of the
request, which the engine carries but never reads).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import attrs

from .fields import default as _row
from .image_layout import ImageGeometry, layout
from .speculative import SpecRequest

if TYPE_CHECKING:
    import numpy as np


DEFAULT_CHAIN = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p",
                 "xtc", "temperature")
DEFAULT_DRY_BREAKERS = ("\n", ":", "\"", "*")


@attrs.frozen
class SamplingParams:
    """Resolved per-request sampling settings (no "unset" values left).

    Field names follow llama.cpp's common_params_sampling; a default is its
    native field row's (protocol/fields.py) where the row has one, else
    upstream's.  `samplers` is the resolved chain: upstream's fixed default
    order, optionally with "adaptive_p" appended (no other order is served).
    `logit_bias` holds (token, bias) pairs in request order, duplicates
    included (each adds), -inf for a ban.
    """

    temperature: float = _row("temperature")
    dynatemp_range: float = _row("dynatemp_range")
    dynatemp_exponent: float = _row("dynatemp_exponent")
    top_k: int = _row("top_k")
    top_p: float = _row("top_p")
    min_p: float = _row("min_p")
    top_n_sigma: float = _row("top_n_sigma")
    xtc_probability: float = _row("xtc_probability")
    xtc_threshold: float = _row("xtc_threshold")
    typical_p: float = _row("typical_p")
    repeat_last_n: int = _row("repeat_last_n")
    repeat_penalty: float = _row("repeat_penalty")
    frequency_penalty: float = _row("frequency_penalty")
    presence_penalty: float = _row("presence_penalty")
    dry_multiplier: float = _row("dry_multiplier")
    dry_base: float = _row("dry_base")
    dry_allowed_length: int = _row("dry_allowed_length")
    dry_penalty_last_n: int = _row("dry_penalty_last_n")
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_DRY_BREAKERS
    mirostat: int = _row("mirostat")
    mirostat_tau: float = _row("mirostat_tau")
    mirostat_eta: float = _row("mirostat_eta")
    adaptive_target: float = _row("adaptive_target")
    adaptive_decay: float = _row("adaptive_decay")
    min_keep: int = _row("min_keep")
    seed: int = _row("seed")  # uint32; 0xFFFFFFFF = pick a random seed
    samplers: tuple[str, ...] = DEFAULT_CHAIN
    logit_bias: tuple[tuple[int, float], ...] = ()
    n_probs: int = _row("n_probs")
    post_sampling_probs: bool = _row("post_sampling_probs")


class Constraint(Protocol):
    """One sequence's constrained-decoding state (engine thread only)."""

    def mask_for(self, history: list[int]) -> np.ndarray | None:
        """The tokens allowed for the next draw (a [1, n_vocab] bool array),
        or None for no restriction.  `history` is the sequence's whole
        context (prompt + drawn tokens); what follows the previous call's
        history is new."""

    def force_end(self) -> None:
        """The job's `ForceEnd` command, applied before the next draw: close
        an open reasoning block (a no-op for a constraint without one)."""


class Grammar(Protocol):
    """What `Job.grammar` holds: shared by the job's copies, read-only."""

    def start(self, n_prompt: int) -> Constraint:
        """A fresh constraint for one sequence whose prompt is n_prompt long."""


class JobSettings(Protocol):
    """The request's resolved field values (the server's frozen request
    record), carried for /slots' per-slot params; the engine never reads
    them.  Named here by a few of the attributes every such record has."""

    n_predict: int
    stream: bool
    samplers: tuple[str, ...]


@attrs.frozen
class Job:
    """One generation request, already tokenized and validated."""

    id: int
    prompt: tuple[int, ...]
    n_predict: int                      # -1 = until the slot's context bound
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    id_slot: int = -1                   # -1 = any free slot
    n_indent: int = 0                   # 0 = off
    t_max_predict_ms: int = -1          # <= 0 = off
    return_progress: bool = False
    n_keep: int = 0                     # context shift: tokens kept (-1 = the prompt)
    n_discard: int = 0                  # context shift: tokens dropped (0 = half)
    shared_prompt: bool = False         # one of n_cmpl > 1 copies: never shifted
    # prompt-cache namespace (engine/prompt_cache.py); None = cache_prompt
    # false: no lookup and no donate-back
    cache_ns: str | None = None
    # --cache-reuse / n_cache_reuse: the smallest cached chunk reused after the
    # prefix by shifting its KV (engine/kv_shift.py); 0 = strict prefix only
    n_cache_reuse: int = 0
    # LoRA scale per loaded adapter, by adapter id (engine/lora.py); shorter
    # than the adapter list (or empty) = the rest at 0, the base model
    lora: tuple[float, ...] = ()
    # a compiled grammar (grammar/compile.CompiledGrammar), possibly wrapped
    # in a reasoning budget (chat/budget.BudgetGrammar); None = unconstrained
    grammar: Grammar | None = attrs.field(default=None, eq=False, repr=False)
    # the request's resolved field values (protocol/fields.py), which /slots
    # reports as the slot's params
    settings: JobSettings | None = attrs.field(default=None, eq=False, repr=False)
    # this request's draft bounds (protocol/speculative.py); None = no
    # speculation for it (the server runs none, or the row cannot speculate)
    speculative: SpecRequest | None = None
    # the request's images, in prompt order (engine/vision.py); each one's
    # placeholder run is already in `prompt`
    images: tuple[ImageInput, ...] = ()
    # the request's audio clips, in prompt order (engine/audio_chat.py); each
    # one's placeholder run is already in `prompt`
    audio: tuple[AudioInput, ...] = ()
    # a continued generation (server/sessions/takeover.py): the tokens an
    # earlier process already published, replayed through the stop, grammar
    # and sampler state and prefilled after the prompt; () = a fresh one
    replay: tuple[int, ...] = ()


@attrs.frozen(eq=False)
class ImageInput:
    """One decoded image of a request: RGB bytes, row-major `height` x
    `width` x 3; `digest` (sha256 of the pixels and size) keys the prompt
    cache, since every image's placeholder tokens are the same ids; `start`
    is the prompt position of its first placeholder token."""

    rgb: bytes = attrs.field(repr=False)
    width: int
    height: int
    digest: str
    start: int


@attrs.frozen
class VisionInfo:
    """The loaded checkpoint's image input: the placeholder token id and
    the run of ids one image fills (`layout`, protocol/image_layout.py):
    `tokens_per_image` placeholders for a fixed-geometry family (llava);
    for a dynamic-resolution one (`geometry` set: Pixtral) a grid that
    follows the image's size, its rows ended by `break_token` and the last
    by `end_token`."""

    image_token: int
    tokens_per_image: int = 0
    family: str = "llava"
    geometry: ImageGeometry | None = None
    break_token: int | None = None
    end_token: int | None = None

    def layout(self, width: int, height: int) -> tuple[int, ...]:
        """The token ids an image of this size takes in the prompt."""
        return layout(self.image_token, self.tokens_per_image, self.geometry,
                      self.break_token, self.end_token, width, height)


@attrs.frozen(eq=False)
class AudioInput:
    """One decoded audio clip of a request: 16 kHz mono float32 samples
    (`samples`, little-endian bytes); `digest` (sha256 of them) keys the
    prompt cache; `start` is the prompt position of its first placeholder
    token."""

    samples: bytes = attrs.field(repr=False)
    digest: str
    start: int


@attrs.frozen
class AudioInfo:
    """The loaded chat checkpoint's audio input: the placeholder token, how
    many placeholder positions one clip fills, and the tokens around them."""

    audio_token: int
    tokens_per_clip: int
    begin_token: int
    end_token: int


# --- commands ---------------------------------------------------------------

POOLINGS = ("none", "mean", "cls", "last", "rank")


@attrs.frozen
class EmbedJob:
    """One input of an embedding or rerank request: its ids (already wrapped
    in the model's special tokens), its token type ids (a query/document
    pair; None = all zero), the pooling (`POOLINGS`; "rank" = the
    classifier's first logit, "none" = one vector per token) and the
    normalization (upstream's embd_normalize: -1 none, 0 max-abs int16,
    1 taxicab, 2 euclidean, > 2 p-norm; not applied to "none" nor "rank").
    A "rank" job runs on the engine's reranker, any other on its embedder."""

    id: int
    tokens: tuple[int, ...]
    pooling: str = "mean"
    normalize: int = 2
    token_types: tuple[int, ...] | None = None


@attrs.frozen(eq=False)
class Embedded:
    """An `EmbedJob`'s result: `vectors` holds one pooled vector (or, for
    pooling "none", one per token), as float32 rows [n, dim]; for "rank"
    it is [[score]].  `n_tokens` is the input's length."""

    job_id: int
    vectors: "np.ndarray"
    n_tokens: int

    @property
    def score(self) -> float:
        return float(self.vectors[0][0])


@attrs.frozen
class Submit:
    job: "Job | EmbedJob"


@attrs.frozen
class Cancel:
    job_id: int


@attrs.frozen
class ForceEnd:
    """Realtime reasoning control: each listed job that is still running
    closes its thinking block before its next draw (its constraint's
    `force_end`), as an exhausted reasoning budget would.  Jobs that ended,
    or whose constraint has no block open, are left alone."""

    job_ids: tuple[int, ...]


@attrs.frozen
class Shutdown:
    pass


@attrs.frozen
class SlotAction:
    """Read (tokens None) or replace a slot's retained token stream: slot
    save reads it, restore writes the file's tokens, erase writes ()."""

    job_id: int
    id_slot: int
    tokens: tuple[int, ...] | None = None
    # restore: the prompt-cache namespace to re-evaluate the tokens into
    # (None: set the stream only)
    cache_ns: str | None = None


@attrs.frozen
class Wake:
    """Reload the model if the engine sleeps (a route that reads the model's
    context waits for it, as upstream's do); answered with `Awake`."""

    job_id: int


@attrs.frozen
class ClearPromptCache:
    """Drop every prompt-cache entry (e.g. before the server idles)."""


# --- events -----------------------------------------------------------------

@attrs.frozen
class ModelInfo:
    """What the server learns about the model once the engine has loaded it."""

    path: str
    model_type: str
    n_ctx: int            # total context (all slots): the KV budget under unified KV
    n_ctx_slot: int       # per slot: what one sequence may hold
    n_ctx_train: int
    n_slots: int
    n_vocab: int
    n_embd: int
    n_params: int
    size_bytes: int
    dtype: str
    quantization: str | None
    # the embedding / rerank models the engine serves beside (or instead of) chat
    embedder: "EmbedderInfo | None" = None
    reranker: "EmbedderInfo | None" = None
    generates: bool = True   # False: an encoder alone, no chat model
    transcriber: "TranscriberInfo | None" = None  # a speech-to-text model served as -m
    vision: VisionInfo | None = None  # None: the checkpoint has no image tower
    audio: AudioInfo | None = None    # None: the chat checkpoint has no audio tower
    kv_unified: bool = False  # every slot draws on one budget of n_ctx tokens


@attrs.frozen
class EmbedderInfo:
    """What the server needs to know of the engine's encoder model."""

    path: str
    architecture: str
    pooling: str          # the pooling in force (--pooling, else the checkpoint's)
    n_embd: int           # the length of a pooled vector
    n_ctx_train: int      # usable tokens per input (the position table)
    n_vocab: int
    is_classifier: bool
    # a decoder reranker's prompt ({query}, {document}); None = the tokenizer's pair template
    rerank_template: str | None = None


@attrs.frozen(eq=False)
class TranscribeJob:
    """One clip for the speech-to-text model: `samples` are 16 kHz mono
    float32 (media/audio.py decoded them); `language` names a language token
    (None: the model's default); `prompt` is earlier text the decoder is
    conditioned on (its <|startofprev|> context; None: none); temperature 0
    decodes greedily; `max_tokens` caps the transcript's tokens (None: the
    model's own per-window limit)."""

    id: int
    samples: "np.ndarray"
    language: str | None = None
    prompt: str | None = None
    temperature: float = 0.0
    max_tokens: int | None = None


@attrs.frozen
class TranscriptPiece:
    """Transcript text decoded in one engine step (one or more tokens)."""

    job_id: int
    text: str
    n_tokens: int


@attrs.frozen
class Transcribed:
    """A `TranscribeJob`'s final record: `text` is the concatenation of every
    `TranscriptPiece.text`; `n_tokens` the transcript's token count."""

    job_id: int
    text: str
    n_tokens: int


@attrs.frozen
class TranscriberInfo:
    """What the server needs to know of the engine's speech-to-text model."""

    path: str
    architecture: str
    n_mels: int
    n_text_ctx: int
    max_tokens: int       # the most transcript tokens one job can produce
    languages: tuple[str, ...]


@attrs.frozen
class Loaded:
    info: ModelInfo


@attrs.frozen
class LoadFailed:
    message: str


@attrs.frozen
class Sleeping:
    """The engine dropped the model after the idle window (--sleep-idle-seconds)."""

    released_bytes: int       # resident memory before minus after (may be <= 0)


@attrs.frozen
class Woke:
    """The engine reloaded the model for a request that arrived while asleep."""

    load_ms: float


@attrs.frozen
class Started:
    job_id: int
    id_slot: int
    n_prompt: int
    n_cache: int


@attrs.frozen
class PromptProgress:
    job_id: int
    total: int
    cache: int
    processed: int
    time_ms: float

    def to_json(self) -> dict:
        """result_prompt_progress::to_json; time_ms is whole milliseconds
        (an int64 of elapsed microseconds / 1000 upstream)."""
        return {"total": self.total, "cache": self.cache, "processed": self.processed,
                "time_ms": int(self.time_ms)}

    def timings(self) -> "Timings":
        """The slot's timings at this point, as upstream puts them on a progress
        frame when timings_per_token is set: the prompt tokens evaluated so far
        (cache-supplied ones apart) and the time they took; nothing generated.
        Before the first batch is evaluated the prompt time is 0."""
        n = self.processed - self.cache
        return Timings(cache_n=self.cache, prompt_n=n,
                       prompt_ms=self.time_ms if n > 0 else 0.0,
                       predicted_n=0, predicted_ms=0.0)


@attrs.frozen
class Timings:
    cache_n: int
    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    draft_n: int = 0                    # draft tokens verified (speculative rows)
    draft_n_accepted: int = 0           # of those, kept
    draft_rounds: int = 0               # verify steps that checked a draft (/metrics)

    def to_json(self) -> dict:
        """server_slot_stats::to_json.  The generation rates count decode
        steps, not tokens: the first token comes from the last prompt
        batch's logits, so n tokens took n - 1 steps (one token: no rate)."""
        p_ms, d_ms = self.prompt_ms, self.predicted_ms
        steps = max(self.predicted_n - 1, 0)
        return {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": p_ms,
            "prompt_per_token_ms": p_ms / self.prompt_n if self.prompt_n > 0 else 0.0,
            "prompt_per_second": 1e3 / p_ms * self.prompt_n if p_ms > 0 else 0.0,
            "predicted_n": self.predicted_n,
            "predicted_ms": d_ms,
            "predicted_per_token_ms": d_ms / steps if steps > 0 else 0.0,
            "predicted_per_second": 1e3 / d_ms * steps if d_ms > 0 else 0.0,
            **({"draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted}
               if self.draft_n > 0 else {}),
        }


@attrs.frozen
class TokenProbs:
    """A drawn token's completion_probabilities entry: its probability and
    the top candidates as (id, probability), best first.  Pre-sampling:
    softmax of the raw logits; post-sampling: the chain's final
    distribution (zero-probability candidates left out)."""

    token: int
    prob: float
    top: tuple[tuple[int, float], ...]


@attrs.frozen
class TokenPiece:
    """One generated token.  `text` is what may be shown now: it can be empty
    while a stop-string prefix or an incomplete UTF-8 sequence is held back.
    `complete` is False when the token ended inside a UTF-8 sequence (upstream
    sends no partial frame for such a token)."""

    job_id: int
    token: int
    text: str
    n_decoded: int
    complete: bool
    last: bool               # the job's final token (a Finished follows)
    timings: Timings
    probs: TokenProbs | None = None   # when the job asked for n_probs


@attrs.frozen
class Finished:
    """The final record of a job.  `content` is the whole generated text: the
    concatenation of every `TokenPiece.text` (n_indent may cut it shorter)."""

    job_id: int
    id_slot: int
    content: str
    tokens: tuple[int, ...]   # every sampled id, stop-excluded ones included
    stop_type: str            # "none" | "eos" | "word" | "limit"
    stopping_word: str
    truncated: bool
    n_prompt: int
    timings: Timings
    probs: tuple[TokenProbs, ...] = ()   # one per token, when asked for


@attrs.frozen
class SlotFreed:
    """A slot went idle (finished, failed or cancelled job)."""

    id_slot: int
    job_id: int
    cancelled: bool


@attrs.frozen
class Awake:
    """The answer to a Wake: the model is loaded."""

    job_id: int


@attrs.frozen
class SlotTokens:
    """The answer to a SlotAction: the slot's tokens after it, and how many
    it held before."""

    job_id: int
    id_slot: int
    tokens: tuple[int, ...]
    previous: int
    cache_ns: str | None = None   # the namespace of the job that left the tokens


@attrs.frozen
class CacheStats:
    """The prompt cache's occupancy, emitted whenever it changes."""

    entries: int
    bytes: int
    peak_bytes: int
    budget_bytes: int     # -1 = no limit
    hits: int             # lookups that supplied a prefix, from either tier
    misses: int
    evictions: int = 0    # entries dropped for the budget, since start
    disk_hits: int = 0    # of the hits, those the disk tier supplied
    reused_memory: int = 0  # prompt tokens supplied, by tier
    reused_disk: int = 0
    reused_shifted: int = 0  # of reused_memory, those in shifted chunks (--cache-reuse)
    disk_entries: int = 0
    disk_bytes: int = 0
    disk_write_dropped: int = 0  # entries not written: the disk writer was WRITE_QUEUE behind


@attrs.frozen
class EngineStats:
    """The engine loop's cumulative counters (they survive an idle sleep),
    emitted with the events of every step that computed for a slot."""

    n_decode: int         # steps that computed for >= 1 slot
    n_busy_slots: int     # sum over those steps of the slots computed


@attrs.frozen
class MlxMemory:
    """MLX's allocator figures (bytes), as the engine thread read them: at
    most once a second while it computes, and when it goes idle."""

    active: int           # live arrays: weights, KV (the prompt cache's included)
    cache: int            # freed buffers MLX keeps for reuse (its buffer cache)
    peak: int             # the most `active` has been since start
    # the engine's memory releases since start (engine/memory_release.py):
    # how many, their time, and the resident bytes they gave back
    releases: int = 0
    release_seconds: float = 0.0
    released_bytes: int = 0


# The failures the engine names by code; their type and sentence are the
# server's (server/http/errors.py ENGINE_FAILURES, one row per code).
FAILURE_CODES = frozenset({
    "invalid_slot", "invalid_tokens", "empty_input", "untokenizable", "exceeds_context",
    # what the loaded checkpoint or the server's options cannot serve
    "no_embeddings", "no_reranking", "no_generation", "no_audio_model", "no_audio_tower",
    "no_image_tower",
    # the embedder's and the transcriber's limits
    "exceeds_batch", "embed_exceeds_context", "unknown_language", "audio_too_long",
    # slot actions and context shift
    "slot_busy", "restore_too_long", "restore_invalid_tokens", "shift_shared_prompt",
    # unified KV: the live sequences outgrew the shared budget
    "context_exceeded",
})


@attrs.frozen
class Failed:
    """A job that ended in error.  A failure the server words carries a
    `code` (FAILURE_CODES), the numbers its sentence names that the error
    body also carries in `extra`, and its sentence's other blanks in
    `words`; the rest (an exception's text) carries its own `kind` and
    `message`."""

    job_id: int
    kind: str = ""            # upstream error type, e.g. "server_error" ("" with a code)
    message: str = ""
    extra: tuple[tuple[str, int], ...] = ()   # also on the wire, in the error body
    code: str = ""
    words: tuple[tuple[str, str | int], ...] = ()   # fill the sentence only

    @classmethod
    def coded(cls, job_id: int, code: str, words: dict[str, str | int] | None = None,
              **numbers: int) -> "Failed":
        if code not in FAILURE_CODES:
            raise ValueError(f"unknown failure code {code!r}")
        return cls(job_id, extra=tuple(numbers.items()), code=code,
                   words=tuple((words or {}).items()))

    @classmethod
    def exceeds_context(cls, job_id: int, n_prompt: int, n_ctx: int) -> "Failed":
        """Upstream's refusal of a prompt its slot cannot hold."""
        return cls.coded(job_id, "exceeds_context", n_prompt_tokens=n_prompt, n_ctx=n_ctx)


class PromptTooLong(Exception):
    """Raised by a tokenizer given a `limit` (engine/vocab.py) when the text
    has at least that many tokens: the ids are never built, so a prompt no
    slot could hold costs no more than counting its tokens."""

    def __init__(self, n_tokens: int) -> None:
        super().__init__(n_tokens)
        self.n_tokens = n_tokens


@attrs.frozen
class StepEvents:
    """Everything one engine step produced, delivered to trio in one hop."""

    events: tuple

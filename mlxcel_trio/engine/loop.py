"""The MLX engine thread: load, warm up, then step forever.

This is the only place MLX runs.  Commands arrive on a thread-safe queue
(`post`); everything one step produced leaves through `emit` as a single
`StepEvents` batch.  The loop blocks on the queue only while it has no work,
and drains it without blocking before every step, so a `Cancel` lands before
the next forward pass.  A step or a command that throws fails
the jobs in flight (and the command's own), never the thread: a dead
engine thread would leave every request waiting.  Nothing here imports trio.

Idle sleep (--sleep-idle-seconds): the idle arm's blocking `get` takes the
window as its timeout.  Its expiry is the decision to sleep, taken by the one
thread that knows nothing is admitted or queued, so no request can be caught
half-served and there is no race with a submit in flight (a submit that
lands first simply resets the wait).  Sleeping drops the scheduler (its
generator, KV caches and any prompt cache it holds) and with it the model,
then returns MLX's buffer cache to the system; the tokenizer (`vocab`) stays.
The thread then parks on the same queue: the next `Submit` reloads the
weights and is served by the new scheduler, so waking is that request's own
latency.  `n_decode` / `n_busy_slots` live here, not in the scheduler, so the
/metrics counters survive a sleep; they reach trio only as the `EngineStats`
event closing each step that computed, never by a read across threads.

Encoders (engine/embedder.py): an `EmbedJob` goes to the engine's embedder
or reranker (by its pooling), whose queue the loop drains one batched chunk
per encoder between two scheduler steps, so a chat stream waits at most one
chunk; a `Cancel` drops a still-queued one.  With an encoder as -m
(--embeddings / --reranking) the scheduler is `NoChat`, which never has
work, and idle sleep is off.

Speech to text (engine/stt/): with a Whisper checkpoint as -m the engine
serves `TranscribeJob`s alone, the same way: its transcriber is one more
side worker the loop steps between scheduler steps (a few tokens per step),
the scheduler is `NoChat` and idle sleep is off.
"""

from __future__ import annotations

import logging
import os
import queue
import time
from pathlib import Path
from typing import Callable

from ..config import RopeOverrides
from ..protocol.kv_types import DEFAULT_PAIR as DEFAULT_KV
from ..protocol.records import (
    Cancel,
    ClearPromptCache,
    EmbedJob,
    EngineStats,
    Failed,
    Finished,
    ForceEnd,
    Job,
    Loaded,
    LoadFailed,
    ModelInfo,
    SamplingParams,
    Shutdown,
    Sleeping,
    SlotAction,
    SlotTokens,
    StepEvents,
    Submit,
    TranscribeJob,
    Woke,
)
from ..protocol.speculative import SpecSettings

log = logging.getLogger("mlxcel.engine")

WARMUP_JOB_ID = -1
# A burst of requests reaches an idle engine a few milliseconds apart (each
# is parsed and tokenized on its own): the first job waits until no other
# arrives for BURST_GAP_S (at most BURST_MAX_S), so the burst is prefilled
# as one batch instead of the first alone and the rest after it.
BURST_GAP_S = 0.001
BURST_MAX_S = 0.010


class NoChat:
    """The scheduler of an engine that serves an encoder alone (--embeddings
    or --reranking with an encoder -m) or a speech-to-text model: it never
    has work, and a generation job or slot action is refused (the routes
    refuse them first)."""

    busy = False
    n_active = 0

    def __init__(self, serves: str = "an embedding or reranking model") -> None:
        self.serves = serves

    def _refuse(self, job_id: int, out: list) -> None:
        out.append(Failed(job_id, "not_supported_error",
                          f"This server does not support generation: it serves {self.serves}"))

    def submit(self, job, out: list) -> None:
        self._refuse(job.id, out)

    def slot_action(self, cmd, out: list) -> None:
        self._refuse(cmd.job_id, out)

    def cancel(self, job_id: int, out: list) -> None:
        pass

    def force_end(self, job_ids) -> None:
        pass

    def clear_prompt_cache(self, out: list) -> None:
        pass

    def step(self, out: list) -> None:
        pass

    def close(self, out: list) -> None:
        pass

    def fail_all(self, out: list, message: str) -> None:
        pass


def _job_of(cmd) -> int | None:
    """The job a command answers to: a Submit's job, a SlotAction's reply."""
    if isinstance(cmd, Submit):
        return cmd.job.id
    return cmd.job_id if isinstance(cmd, SlotAction) else None


def n_ctx_train_of(config: dict, n_ctx: int) -> int:
    """The checkpoint's training context; a config without one is taken to
    allow whatever context was asked for."""
    return int(config.get("max_position_embeddings") or n_ctx)


def slot_context(n_ctx: int, n_slots: int, n_ctx_train: int) -> int:
    """Each slot's context: an even share of the total, capped (with
    upstream's warning) at the training context, as upstream's server does.
    Computed once per load; admission, the bound, /props and /slots all read
    this value."""
    n_ctx_slot = n_ctx // n_slots
    if n_ctx_slot > n_ctx_train:
        log.warning("the slot context (%d) exceeds the training context of the model (%d) "
                    "- capping", n_ctx_slot, n_ctx_train)
        n_ctx_slot = n_ctx_train
    return n_ctx_slot


def _count(n: int) -> str:
    """A parameter count as people say it: 272.38K, 596.05M, 7.62B."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _model_facts(model, config: dict, path: Path, n_ctx: int, n_ctx_slot: int,
                 n_slots: int) -> ModelInfo:
    from mlx.utils import tree_flatten

    params = tree_flatten(model.parameters())
    quant = config.get("quantization") or config.get("quantization_config")
    bits = quant.get("bits", 32) if isinstance(quant, dict) else 32
    n_params = 0
    size = 0
    dtype = "unknown"
    for name, p in params:
        if ".lora_" in name:  # LoRA adapters are not the model's parameters
            continue
        size += p.nbytes
        if name.endswith((".scales", ".biases")):
            continue
        # packed quantized weights hold 32 // bits values per uint32
        n_params += p.size * (32 // bits) if p.dtype.__str__().endswith("uint32") else p.size
        if name.endswith("embed_tokens.weight") and dtype == "unknown" and \
                not p.dtype.__str__().endswith("uint32"):
            dtype = str(p.dtype).removeprefix("mlx.core.")
    if dtype == "unknown":  # quantized embeddings: the float type of the rest
        dtype = next((str(p.dtype).removeprefix("mlx.core.") for name, p in params
                      if not name.endswith((".scales", ".biases"))
                      and not str(p.dtype).endswith("uint32")), "unknown")
    return ModelInfo(
        path=str(path),
        model_type=config.get("model_type", "unknown"),
        n_ctx=n_ctx,
        n_ctx_slot=n_ctx_slot,
        n_ctx_train=n_ctx_train_of(config, n_ctx),
        n_slots=n_slots,
        n_vocab=int(config.get("vocab_size", 0)),
        n_embd=int(config.get("hidden_size", 0)),
        n_params=n_params,
        size_bytes=size,
        dtype=dtype,
        quantization=f"{bits}-bit" if bits != 32 else None,
    )


def _resident_bytes() -> int:
    """The process's resident memory where the OS reports it (Linux), else
    what MLX's allocator holds (safetensors weights may be file-backed pages
    MLX does not count, so RSS is the better measure where there is one)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import mlx.core as mx

        return mx.get_active_memory() + mx.get_cache_memory()


class EngineLoop:
    def __init__(self, model_path: str, *, n_slots: int, ctx_size: int,
                 batch_size: int, warmup: bool,
                 emit: Callable[[StepEvents], None], special: bool = False,
                 cache_ram_mib: int = 0, sleep_idle_s: float | None = None,
                 context_shift: bool = False, cont_batching: bool = True,
                 rope: RopeOverrides = RopeOverrides(),
                 kv_types: tuple[str, str] = DEFAULT_KV, blas: str = "auto",
                 weights: str = "auto", encoder_only: str | None = None,
                 embedding_model: str | None = None, reranker_model: str | None = None,
                 pooling: str | None = None, embd_n_batch: int = 512,
                 speculative: SpecSettings = SpecSettings(),
                 lora: tuple[str, ...] = (), images: bool = True,
                 image_budget: tuple[int, int] = (-1, -1), lockstep=None,
                 split_kind: str | None = None,
                 cache_disk: tuple[str | None, int] = (None, -1)) -> None:
        self._path = Path(model_path)
        self._cache_disk = cache_disk    # the prompt cache's disk tier (cache_disk.py): dir, MiB
        self._images = images            # False (--no-mmproj): no image or audio tower is loaded
        self._image_budget = image_budget  # --image-min-tokens, --image-max-tokens (<= 0: the model's)
        # several ranks, one model (engine/distributed.py): the per-step
        # channel, and how the model is split (tensor | pipeline)
        self._lockstep = lockstep
        self._split_kind = split_kind
        self._lora = lora                # adapter paths, in id order (engine/lora.py)
        # The encoder side: -m itself (encoder_only names its role, "embed" or
        # "rank"), or models beside the chat one (--embedding-model,
        # --reranker-model).  Each role is one Embedder; a job goes to the
        # "rank" one when its pooling is rank, else to the "embed" one.
        self._encoder_only = encoder_only
        self._encoder_paths = {"embed": embedding_model, "rank": reranker_model}
        if encoder_only is not None:
            self._encoder_paths[encoder_only] = str(model_path)
        self._pooling = pooling          # --pooling (the embed role's); None = the checkpoint's
        self._embd_n_batch = embd_n_batch
        self.embedders: dict = {}        # role -> engine/embedder.py's Embedder, once loaded
        self.transcriber = None          # engine/stt's Transcriber when -m is a Whisper checkpoint
        self.embed_vocab = None          # the roles' tokenizers; published before Loaded
        self.rerank_vocab = None
        self._n_slots = n_slots
        self._ctx_size = ctx_size
        self._batch_size = batch_size
        self._warmup = warmup
        self._special = special
        self._cache_ram_mib = cache_ram_mib  # 0 = no prompt cache, -1 = no limit
        self._context_shift = context_shift
        self._cont_batching = cont_batching
        self._rope = rope
        self._kv_types = kv_types
        self._blas = blas  # --blas, for the load summary's advice
        self._weights = weights  # --weights: auto | keep | float32
        self._weights_note: str | None = None
        self._blas_fitted = False
        self._emit = emit
        self._spec = speculative
        self._draft = None       # the draft model (-md), loaded with the target
        self._vision = None      # engine/vision.VisionEncoder: an integrated VLM's image tower
        self._audio = None       # engine/audio_chat.AudioEncoder: a chat model's audio tower
        # None = never sleep (an encoder alone is small and has no chat to drop)
        self._sleep_idle_s = None if encoder_only is not None else sleep_idle_s
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self.vocab = None  # published before Loaded is emitted; read-only after
        self._n_ctx_slot = 0  # set once by _load; a wake reuses it
        # Cumulative, this thread's own; trio keeps the copy EngineStats carries.
        self.n_decode = 0       # scheduler steps that computed for >= 1 slot
        self.n_busy_slots = 0   # sum over those steps of the slots computed

    @staticmethod
    def checkpoint_problem(path: str, kv_types: tuple[str, str] = DEFAULT_KV,
                           encoder_flag: str | None = None, rank: bool = False) -> str | None:
        """Why mlx-lm could not build the checkpoint at `path` with these KV
        cache types, or None (asked before anything loads; see
        engine/architectures.py).  With `encoder_flag` (--embeddings /
        --reranking) `path` must be an encoder instead (engine/embedder.py)."""
        from .architectures import problem

        if encoder_flag is not None:
            from .embedder import checkpoint_problem

            return checkpoint_problem(path, encoder_flag, rank=rank)
        from .stt.transcriber import checkpoint_problem as stt_problem, is_whisper

        if is_whisper(path):
            return stt_problem(path)

        return problem(path, kv_types)

    @staticmethod
    def image_budget_problem(path: str, name: str, budget: tuple[int, int]) -> str | None:
        """Why --image-min-tokens / --image-max-tokens cannot be honored on
        the checkpoint at `path`, or None (engine/vision.py)."""
        from .vision import budget_problem

        return budget_problem(path, name, *budget)

    @staticmethod
    def serves_speech(path: str) -> bool:
        """Whether the checkpoint at `path` is a speech-to-text model (a
        Whisper checkpoint), which the engine serves without a chat model."""
        from .stt.transcriber import is_whisper

        return is_whisper(path)

    @staticmethod
    def adapter_problem(paths: tuple[str, ...], encoder_flag: str | None = None) -> str | None:
        """Why LoRA adapters at `paths` cannot be served (every problem, one
        line each), from their configs alone; None when they can be loaded."""
        if encoder_flag is not None:
            return (f"--lora applies to a generating model; {encoder_flag} serves an "
                    "encoder: drop one of them")
        from .lora_files import adapter_problem

        problems = [p for p in map(adapter_problem, paths) if p is not None]
        return "; ".join(f"LoRA adapter {p}" for p in problems) or None

    # -- several ranks: the bridge's way to engine/distributed.py -------------------

    @staticmethod
    def world():
        """This process's place among the ranks mlx.launch started."""
        from .distributed import World

        return World.from_env()

    @staticmethod
    def split_plan(cfg, world) -> str:
        """How `cfg`'s model splits among `world`'s ranks ("tensor" or
        "pipeline"); ValueError naming what cannot be served so."""
        from .distributed import plan

        return plan(cfg, world)

    @staticmethod
    def join(world):
        """Join the other ranks (blocks until all have): the lockstep channel."""
        from .distributed import Lockstep, init_group

        lockstep = Lockstep(init_group(world))
        if lockstep.ring_doorbell():
            log.info("rank %d of %d: followers wait on a doorbell while rank 0 is idle",
                     world.rank, world.size)
        else:
            log.info("rank %d of %d: no doorbell (not a ring hostfile); followers poll "
                     "while rank 0 is idle", world.rank, world.size)
        return lockstep

    def post(self, command) -> None:
        """Thread-safe, never blocks: callable from trio or from a cancel path."""
        self._commands.put(command)

    # -- thread body -------------------------------------------------------------

    def run(self) -> None:
        try:
            scheduler = self._load()
        except Exception as exc:  # reported to trio, never raised across threads
            # one line; the traceback only with -v (it is ours, not the operator's)
            log.error("model load failed: %s: %s", type(exc).__name__, exc,
                      exc_info=log.isEnabledFor(logging.DEBUG))
            self._emit(StepEvents((LoadFailed(f"{type(exc).__name__}: {exc}"),)))
            return
        # _serve must hold the only reference (an idle sleep drops it to free
        # the model), so this frame hands it over in a box and keeps none
        box = [scheduler]
        del scheduler
        self._serve(box)

    def _load_encoders(self) -> dict:
        """Load each configured encoder role; a checkpoint asked to embed
        whose pooling resolves to rank (a cross-encoder without --pooling)
        takes the rank role.  Returns ModelInfo's embedder / reranker."""
        from .embedder import Embedder
        from .vocab import Vocab

        for role, path in self._encoder_paths.items():
            if path is None:
                continue
            emb = Embedder.load(path, n_batch=self._embd_n_batch,
                                chunk_tokens=self._batch_size,
                                pooling="rank" if role == "rank" else self._pooling)
            role = "rank" if emb.pooling == "rank" else "embed"
            vocab = Vocab(Path(path), emb.info.vocab_size)
            if role == "rank":
                self.rerank_vocab = vocab
            else:
                self.embed_vocab = vocab
            self.embedders[role] = emb
            log.info("encoder loaded: %s | %s, pooling %s, %d-dimensional output, inputs up "
                     "to %d tokens", path, emb.info.architecture, emb.pooling,
                     emb.info.embedding_size, min(emb.info.max_positions, self._embd_n_batch))
        return {"embedder": self.embedders["embed"].public if "embed" in self.embedders else None,
                "reranker": self.embedders["rank"].public if "rank" in self.embedders else None}

    def _load_encoder_only(self):
        """-m is an encoder: no chat model, no scheduler work."""
        import json

        import attrs

        t0 = time.perf_counter()
        roles = self._load_encoders()
        emb = next(iter(self.embedders.values()))
        self.vocab = self.embed_vocab or self.rerank_vocab
        config = json.loads((self._path / "config.json").read_text())
        n_ctx = int(emb.info.max_positions)
        info = _model_facts(emb.model, config, self._path, n_ctx, n_ctx, self._n_slots)
        info = attrs.evolve(info, n_ctx_train=n_ctx, n_vocab=int(emb.info.vocab_size),
                            n_embd=int(emb.info.embedding_size), dtype=emb.info.dtype,
                            generates=False, **roles)
        log.info("model loaded in %.2f s", time.perf_counter() - t0)
        self._emit(StepEvents((Loaded(info),)))
        return NoChat()

    def _load_transcriber_only(self):
        """-m is a Whisper checkpoint: a transcriber, no chat model."""
        import json

        import attrs

        from .stt.transcriber import Transcriber
        from .vocab import Vocab

        t0 = time.perf_counter()
        self.transcriber = t = Transcriber.load(self._path)
        self.vocab = Vocab(self._path, t.dims.n_vocab)
        self._sleep_idle_s = None  # nothing worth dropping: the model is the whole server
        config = json.loads((self._path / "config.json").read_text())
        n_ctx = t.dims.n_text_ctx
        info = _model_facts(t.model, config, self._path, n_ctx, n_ctx, 1)
        info = attrs.evolve(info, n_ctx_train=n_ctx, n_vocab=t.dims.n_vocab,
                            n_embd=t.dims.n_text_state, generates=False, transcriber=t.public)
        log.info("model loaded in %.2f s: %s | whisper (speech to text), %s, %s parameters, "
                 "%s | %d Mel bins, text context %d, languages: %s",
                 time.perf_counter() - t0, self._path, info.quantization or info.dtype,
                 _count(info.n_params), _mib(info.size_bytes), t.dims.n_mels, n_ctx,
                 ", ".join(t.public.languages) or "the model's own")
        self._emit(StepEvents((Loaded(info),)))
        return NoChat("a speech-to-text model")

    def _load(self):
        from .stt.transcriber import is_whisper
        from .vocab import Vocab

        if self._encoder_only:
            return self._load_encoder_only()
        if is_whisper(self._path):
            return self._load_transcriber_only()
        t0 = time.perf_counter()
        model, config = self._load_model()
        self._fit_blas(config)
        n_ctx = self._ctx_size or int(config.get("max_position_embeddings") or 4096)
        self._n_ctx_slot = slot_context(n_ctx, self._n_slots, n_ctx_train_of(config, n_ctx))
        vocab = Vocab(self._path, int(config.get("vocab_size", 0)) or None)
        self.vocab = vocab
        if self._spec.draft_model is not None and "draft-simple" in self._spec.types:
            self._draft = self._load_draft(Path(self._spec.draft_model))
        scheduler = self._new_scheduler(model)
        if self._kv_types != DEFAULT_KV:
            from ..protocol.kv_types import KV_CACHE_TYPES

            k, v = self._kv_types
            log.info("KV cache: K as %s (%s), V as %s (%s)", k, KV_CACHE_TYPES[k].describe(),
                     v, KV_CACHE_TYPES[v].describe())
        if self._warmup:
            self._run_warmup(scheduler, vocab)
        info = _model_facts(model, config, self._path, n_ctx, self._n_ctx_slot, self._n_slots)
        if self._vision is not None:
            import attrs

            info = attrs.evolve(info, vision=self._vision.info)
        if self._audio is not None:
            import attrs

            info = attrs.evolve(info, audio=self._audio.info)
        if any(self._encoder_paths.values()):
            import attrs

            info = attrs.evolve(info, **self._load_encoders())
        self._report(info, time.perf_counter() - t0, self._blas)
        self._emit(StepEvents((Loaded(info),)))
        return scheduler

    def _load_model(self):
        """The model as the weight policy serves it (engine/weights.py), and
        its config (without the quantization block once dequantized)."""
        import mlx.core as mx

        from . import audio_chat, rope, vision, weights

        model, config = rope.load(self._path, self._rope, lazy=True)
        model, note = weights.apply(model, self._weights)
        if self._lockstep is not None:  # before the weights are read: each rank reads its share
            from .distributed import share_tokens, split_model

            split_model(model, self._split_kind, self._lockstep.group)
            share_tokens(self._lockstep.group)
        mx.eval(model.parameters())
        if vision.is_vlm(config):
            # the image tower takes the text model's served float type
            if self._vision is None and self._images:
                dtype = vision.embed_tokens(model).weight.dtype
                self._vision = vision.load_encoder(
                    self._path, config, dtype if mx.issubdtype(dtype, mx.floating) else None,
                    self._image_budget)
                info = self._vision.info
                if info.geometry is None:
                    log.info("image input: %s tower, %d tokens per image",
                             config["vision_config"].get("model_type", "vision"),
                             info.tokens_per_image)
                else:
                    g = info.geometry
                    log.info("image input: %s tower, tokens per image follow its size "
                             "(%d-pixel patches, %s)", info.family, g.unit,
                             f"{g.min_pixels}..{g.max_pixels} pixels (token budget)"
                             if g.budgeted else f"longest edge {g.longest_edge}")
            config = vision.flat_config(config)
        if audio_chat.is_audio_chat(config):
            # the audio tower takes the text model's served float type
            if self._audio is None and self._images:
                dtype = audio_chat.text_model(model).embed_tokens.weight.dtype
                self._audio = audio_chat.AudioEncoder.load(
                    self._path, config, dtype if mx.issubdtype(dtype, mx.floating) else None)
                log.info("audio input: %s conformer, %d tokens per clip",
                         config["model_type"], self._audio.info.tokens_per_clip)
            config = audio_chat.flat_config(config)
        if self._lora:
            from . import lora
            from .lora_files import read_adapter

            # after the weight policy: the adapters take the served dtype
            model = lora.install(model, [read_adapter(p) for p in self._lora])
            log.info("LoRA: %d adapter(s) loaded: %s", len(self._lora), ", ".join(self._lora))
        if note is not None:
            if self._weights_note is None:  # said once, not again at each wake
                log.info("%s", note)
            self._weights_note = note
        if weights.stored_form(model) is None:
            config = {k: v for k, v in config.items()
                      if k not in ("quantization", "quantization_config")}
        return model, config

    def _fit_blas(self, config: dict) -> None:
        import mlx.core as mx

        from .platform_report import fit_blas_threads

        if mx.default_device() == mx.cpu:
            line = fit_blas_threads(config)
            if line is not None and not self._blas_fitted:  # said once, not at each wake
                log.info("%s", line)
            self._blas_fitted = True

    def _load_draft(self, path: Path):
        import mlx.core as mx
        from mlx_lm.utils import load_model

        from .speculative.draft_model import cache_kinds

        draft, _ = load_model(path, lazy=True)
        mx.eval(draft.parameters())
        kinds = cache_kinds(draft)
        if kinds != {"KVCache"}:
            raise ValueError(f"draft model {path}: its {', '.join(sorted(kinds))} layers cannot "
                             "be rolled back after a rejected draft; use a plain-attention "
                             "draft checkpoint")
        log.info("draft model loaded: %s (speculative types: %s)", path,
                 ",".join(self._spec.types))
        return draft

    def _new_scheduler(self, model):
        """A scheduler with a fresh prompt cache: the cache lives and dies with
        its scheduler, so an idle sleep frees both."""
        from .cache_disk import disk_tier
        from .prompt_cache import PromptCache, budget_from_mib
        from .scheduler import Scheduler
        from .speculative import build_chain

        # a pipeline's ranks hold different layers, so their KV bytes (the
        # prompt cache's budget) differ and so would its evictions
        cache_on = self._cache_ram_mib != 0 and self._split_kind != "pipeline"
        return Scheduler(model, self.vocab, n_slots=self._n_slots,
                         clock=self._lockstep.clock if self._lockstep is not None else None,
                         drafter=build_chain(self._spec, self._draft),
                         n_ctx_slot=self._n_ctx_slot,
                         batch_size=self._batch_size, special=self._special,
                         context_shift=self._context_shift,
                         cont_batching=self._cont_batching,
                         kv_types=self._kv_types, n_adapters=len(self._lora),
                         vision=self._vision, audio=self._audio,
                         prompt_cache=(PromptCache(budget_from_mib(self._cache_ram_mib),
                                                   disk=disk_tier(*self._cache_disk,
                                                                  self._lockstep))
                                       if cache_on else None))

    @staticmethod
    def _report(info: ModelInfo, seconds: float, blas: str) -> None:
        """One readable load summary, then what the platform costs (if anything)."""
        import mlx.core as mx

        from .platform_report import describe

        device = "cpu" if mx.default_device() == mx.cpu else "gpu"
        platform, warning = describe(device, info.dtype, info.quantization, blas)
        log.info("model loaded in %.2f s: %s | %s, %s, %s parameters, %s | context %d "
                 "(training %d), %d slots of %d | %s", seconds, info.path, info.model_type,
                 info.quantization or info.dtype, _count(info.n_params),
                 _mib(info.size_bytes), info.n_ctx, info.n_ctx_train, info.n_slots,
                 info.n_ctx_slot, platform)
        if warning:
            log.warning("%s", warning)

    def _run_warmup(self, scheduler, vocab) -> None:
        """One short greedy generation, so the first request does not pay for
        graph compilation and allocation."""
        log.info("warming up (skip with --no-warmup)")
        first = next(iter(vocab.eos_ids), 0)
        sink: list = []
        # greedy, and the stochastic chain (its filters are compiled graphs)
        for i, temp in enumerate((0.0, 1.0)):
            job = Job(WARMUP_JOB_ID - i, (first, first), n_predict=2,
                      sampling=SamplingParams(temperature=temp, seed=0))
            scheduler.submit(job, sink)
        while scheduler.busy:
            scheduler.step(sink)

    def _serve(self, box: list) -> None:
        scheduler = box.pop()
        lockstep = self._lockstep
        if lockstep is not None and not lockstep.leader:
            return self._follow(scheduler, lockstep)
        commands = self._commands
        # the side workers: encoders and the transcriber, stepped between scheduler steps
        embedders = tuple(self.embedders.values()) + (
            (self.transcriber,) if self.transcriber is not None else ())
        last: list = []   # the previous step's events (a lockstep record's digest)
        while True:
            out: list = []
            taken: list = []  # the commands applied before this step, in order
            block = not scheduler.busy and not any(e.pending for e in embedders)
            burst_end = None  # set when an idle engine takes a job: wait for its companions
            while True:
                try:
                    if block:
                        cmd = commands.get(timeout=self._sleep_idle_s)
                    elif burst_end is not None and (left := burst_end - time.perf_counter()) > 0:
                        cmd = commands.get(timeout=min(BURST_GAP_S, left))
                    else:
                        cmd = commands.get_nowait()
                except queue.Empty:
                    if not block:
                        break
                    # the idle window passed with nothing admitted or queued
                    before = _resident_bytes()
                    scheduler = None  # the last reference: the model goes with it
                    scheduler, cmd = self._sleep(before)
                    if scheduler is None:  # Shutdown while asleep
                        return
                if block and isinstance(cmd, Submit):
                    burst_end = time.perf_counter() + BURST_MAX_S
                block = False
                if isinstance(cmd, Shutdown):
                    if lockstep is not None:
                        self._lead(lockstep, [*taken, cmd], last, scheduler, out)
                    scheduler.close(out)
                    if out:
                        self._emit(StepEvents(tuple(out)))
                    return
                taken.append(cmd)
                self._apply_or_fail(scheduler, embedders, cmd, out)
            if lockstep is not None and not self._lead(lockstep, taken, last, scheduler, out):
                return
            n_active = scheduler.n_active
            if n_active:
                self.n_decode += 1
                self.n_busy_slots += n_active
            try:
                scheduler.step(out)
            except Exception as exc:
                # Fail the jobs in flight, never the server: the next request
                # starts from a fresh batch.
                log.exception("engine step failed")
                scheduler.fail_all(out, f"{type(exc).__name__}: {exc}")
                if lockstep is not None:  # the ranks may no longer agree: stop them all
                    self._stop_world(out)
                    return
            if n_active:
                # one small record per computing step, in the hop its events take
                out.append(EngineStats(self.n_decode, self.n_busy_slots))
            for embedder in embedders:
                if embedder.pending:
                    # one chunk between two scheduler steps: decode waits at most this long
                    embedder.step(out)
            if out:
                self._emit(StepEvents(tuple(out)))
            last = out

    def _apply_or_fail(self, scheduler, embedders, cmd, out: list) -> None:
        """`_apply`, where a command that raises fails its job and the
        admitted ones instead of the thread: an exception that ended it would
        leave every request waiting forever."""
        try:
            self._apply(scheduler, embedders, cmd, out)
        except Exception as exc:
            log.exception("engine command failed")
            self._command_failed(scheduler, cmd, out, f"{type(exc).__name__}: {exc}")

    def _apply(self, scheduler, embedders, cmd, out: list) -> None:
        """One command, as the scheduler (or an encoder) takes it."""
        if isinstance(cmd, Submit) and isinstance(cmd.job, EmbedJob):
            self._submit_embed(cmd.job, out)
        elif isinstance(cmd, Submit) and isinstance(cmd.job, TranscribeJob):
            self._submit_transcribe(cmd.job, out)
        elif isinstance(cmd, Submit):
            scheduler.submit(cmd.job, out)
        elif isinstance(cmd, Cancel):
            if not any(e.cancel(cmd.job_id) for e in embedders):
                scheduler.cancel(cmd.job_id, out)
        elif isinstance(cmd, ForceEnd):
            scheduler.force_end(cmd.job_ids)
        elif isinstance(cmd, SlotAction):
            scheduler.slot_action(cmd, out)
        elif isinstance(cmd, ClearPromptCache):
            scheduler.clear_prompt_cache(out)

    # -- several ranks (engine/distributed.py) ---------------------------------------

    def _lead(self, lockstep, taken: list, last: list, scheduler, out: list) -> bool:
        """Rank 0: send this step's record; False once the other ranks are
        gone (every job in flight fails and the server stops)."""
        from .distributed import DistributedError

        try:
            lockstep.lead(taken, last)
            return True
        except DistributedError as exc:
            log.error("distributed: %s; stopping", exc)
            scheduler.fail_all(out, f"the other ranks stopped: {exc}")
            self._stop_world(out)
            return False

    def _stop_world(self, out: list) -> None:
        """The process stops as on SIGTERM (HTTP answers what it holds)."""
        import signal

        if out:
            self._emit(StepEvents(tuple(out)))
        os.kill(os.getpid(), signal.SIGTERM)

    def _follow(self, scheduler, lockstep) -> None:
        """A follower: rank 0's commands, then the same step; its own events
        go nowhere.  Any failure ends the process (mlx.launch then stops the
        other ranks): a follower that missed a step cannot rejoin."""
        last: list = []
        while True:
            out: list = []
            for cmd in lockstep.follow(last):
                if isinstance(cmd, Shutdown):
                    scheduler.close(out)
                    return
                # as rank 0 took it: a command that failed there fails here too,
                # and the schedulers stay the same
                self._apply_or_fail(scheduler, (), cmd, out)
            scheduler.step(out)
            last = out

    def _submit_embed(self, job: EmbedJob, out: list) -> None:
        rank = job.pooling == "rank"
        embedder = self.embedders.get("rank" if rank else "embed")
        if embedder is None:
            what, flag = ("reranking", "--reranking") if rank else ("embeddings", "--embeddings")
            out.append(Failed(job.id, "not_supported_error",
                              f"This server does not support {what}. Start it with `{flag}`"))
        else:
            embedder.submit(job, out)

    def _submit_transcribe(self, job: TranscribeJob, out: list) -> None:
        if self.transcriber is None:
            out.append(Failed(job.id, "not_supported_error",
                              "The current model does not support audio input."))
        else:
            self.transcriber.submit(job, out)

    @staticmethod
    def _command_failed(scheduler, cmd, out: list, message: str) -> None:
        """The admitted jobs fail (the generator may be half-updated) and so
        does the command's own job, whose request is waiting for an answer."""
        scheduler.fail_all(out, message)
        job_id = _job_of(cmd)
        answered = any(isinstance(ev, (Failed, Finished, SlotTokens)) and ev.job_id == job_id
                       for ev in out)
        if job_id is not None and not answered:
            out.append(Failed(job_id, "server_error", message))

    # -- idle sleep ----------------------------------------------------------------

    def _sleep(self, before: int):
        """Free the model's memory (the caller dropped the scheduler), then
        park until a command that needs the model: a Submit or a SlotAction
        (reload; returns the new scheduler and that command), or Shutdown
        (returns None and it).  A Cancel or a ForceEnd names a job that already
        ended and a ClearPromptCache finds the cache already gone: all are
        dropped.  The encoders stay loaded: embedding and rerank jobs are
        served while asleep, one chunk per encoder between two reads of the
        queue (a Cancel then drops a still-queued one), without waking the
        chat model; jobs still queued when a wake comes go on after it."""
        import gc

        import mlx.core as mx

        self._draft = None  # the draft model sleeps with the target
        gc.collect()  # the model graph may hold reference cycles
        mx.clear_cache()
        released = before - _resident_bytes()
        log.info("server is entering sleeping state (released %.1f MiB)", released / 2**20)
        self._emit(StepEvents((Sleeping(released),)))
        embedders = tuple(self.embedders.values())
        while True:
            try:
                if any(e.pending for e in embedders):
                    cmd = self._commands.get_nowait()
                else:
                    cmd = self._commands.get()
            except queue.Empty:  # embedding work and nothing else to read
                out: list = []
                for embedder in embedders:
                    if embedder.pending:
                        embedder.step(out)
                if out:
                    self._emit(StepEvents(tuple(out)))
                continue
            if isinstance(cmd, Shutdown):
                return None, cmd
            if isinstance(cmd, Submit) and isinstance(cmd.job, EmbedJob):
                out = []
                self._submit_embed(cmd.job, out)
                if out:
                    self._emit(StepEvents(tuple(out)))
                continue
            if isinstance(cmd, Cancel):
                for embedder in embedders:
                    embedder.cancel(cmd.job_id)
                continue
            if not isinstance(cmd, (Submit, SlotAction)):
                continue
            try:
                return self._wake(), cmd
            except Exception as exc:  # stay asleep; this request fails, not the server
                log.exception("reloading the model failed")
                self._emit(StepEvents((Failed(_job_of(cmd), "server_error",
                                              f"{type(exc).__name__}: {exc}"),)))

    def _wake(self):
        t0 = time.perf_counter()
        model, _ = self._load_model()
        if self._spec.draft_model is not None and "draft-simple" in self._spec.types:
            self._draft = self._load_draft(Path(self._spec.draft_model))
        scheduler = self._new_scheduler(model)
        load_ms = (time.perf_counter() - t0) * 1e3
        log.info("server is exiting sleeping state (model reloaded in %.0f ms)", load_ms)
        self._emit(StepEvents((Woke(load_ms),)))
        return scheduler

"""Loading the engine's models: the chat model and every side part.

`Loading` is the engine loop's loading half (engine/loop.py's `EngineLoop`
inherits it): the chat model under the weight policy, RoPE overrides and the
split across ranks; its image and audio towers, LoRA adapters and draft
model; or, instead of a chat model, an encoder or a Whisper transcriber; the
encoders beside a chat model; the warm-up and the one-line load report.  A
wake after an idle sleep loads the same way (`_load_model`, `_load_draft`,
`_new_scheduler`).  Every setting comes from the loop's `EngineSpec`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from ..protocol.kv_types import DEFAULT_PAIR as DEFAULT_KV
from ..protocol.records import Failed, Job, Loaded, ModelInfo, SamplingParams, StepEvents

log = logging.getLogger("mlxcel.engine")

WARMUP_JOB_ID = -1


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
        out.append(Failed.coded(job_id, "no_generation", {"serves": self.serves}))

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


def n_ctx_train_of(config: dict, n_ctx: int) -> int:
    """The checkpoint's training context; a config without one is taken to
    allow whatever context was asked for."""
    return int(config.get("max_position_embeddings") or n_ctx)


def slot_context(n_ctx: int, n_slots: int, n_ctx_train: int, unified: bool = False) -> int:
    """What one sequence may hold: the whole context under unified KV (the
    slots then share it as one budget, kv_budget.py), else an even share of
    it; capped (with upstream's warning) at the training context, as
    upstream's server does.  Computed once per load; admission, the bound,
    /props and /slots all read this value."""
    n_ctx_slot = n_ctx if unified else n_ctx // n_slots
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


def model_facts(model, config: dict, path: Path, n_ctx: int, n_ctx_slot: int,
                 n_slots: int, kv_unified: bool = False) -> ModelInfo:
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
        kv_unified=kv_unified,
        n_vocab=int(config.get("vocab_size", 0)),
        n_embd=int(config.get("hidden_size", 0)),
        n_params=n_params,
        size_bytes=size,
        dtype=dtype,
        quantization=f"{bits}-bit" if bits != 32 else None,
    )


class Loading:
    """The loading methods of `EngineLoop` (its state is set up by its
    constructor)."""

    def _load_encoders(self) -> dict:
        """Load each configured encoder role; a checkpoint asked to embed
        whose pooling resolves to rank (a cross-encoder without --pooling)
        takes the rank role.  Returns ModelInfo's embedder / reranker."""
        from .embedder import Embedder
        from .vocab import Vocab

        for role, path in self._encoder_paths.items():
            if path is None:
                continue
            emb = Embedder.load(path, n_batch=self.spec.embd_n_batch,
                                chunk_tokens=self.spec.batch_size,
                                pooling="rank" if role == "rank" else self.spec.pooling)
            role = "rank" if emb.pooling == "rank" else "embed"
            vocab = Vocab(Path(path), emb.info.vocab_size)
            if role == "rank":
                self.rerank_vocab = vocab
            else:
                self.embed_vocab = vocab
            self.embedders[role] = emb
            log.info("encoder loaded: %s | %s, pooling %s, %d-dimensional output, inputs up "
                     "to %d tokens", path, emb.info.architecture, emb.pooling,
                     emb.info.embedding_size, min(emb.info.max_positions, self.spec.embd_n_batch))
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
        info = model_facts(emb.model, config, self._path, n_ctx, n_ctx, self.spec.n_slots)
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
        info = model_facts(t.model, config, self._path, n_ctx, n_ctx, 1)
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

        if self.spec.encoder_only:
            return self._load_encoder_only()
        if is_whisper(self._path):
            return self._load_transcriber_only()
        t0 = time.perf_counter()
        model, config = self._load_model()
        from .native.layers import installed

        on_native = installed(model) > 0
        self._fit_blas(config)
        if self.spec.n_ctx_train:  # --override-kv ARCH.context_length
            config = {**config, "max_position_embeddings": self.spec.n_ctx_train}
        n_ctx = self.spec.ctx_size or int(config.get("max_position_embeddings") or 4096)
        self._n_ctx = n_ctx
        self._n_ctx_slot = slot_context(n_ctx, self.spec.n_slots, n_ctx_train_of(config, n_ctx),
                                        self.spec.kv_unified)
        vocab = Vocab(self._path, int(config.get("vocab_size", 0)) or None)
        vocab.override_specials(*self.spec.specials)
        self.vocab = vocab
        self._draft = self._asked_draft()
        scheduler = self._new_scheduler(model)
        log.info("%s", self.release.summary())
        if self.spec.kv_types != DEFAULT_KV:
            from ..protocol.kv_types import KV_CACHE_TYPES

            k, v = self.spec.kv_types
            log.info("KV cache: K as %s (%s), V as %s (%s); %s", k, KV_CACHE_TYPES[k].describe(),
                     v, KV_CACHE_TYPES[v].describe(), scheduler.kv_summary())
        if self.spec.warmup:
            self._run_warmup(scheduler, vocab)
        info = model_facts(model, config, self._path, n_ctx, self._n_ctx_slot, self.spec.n_slots,
                           self.spec.kv_unified)
        if self._vision is not None:
            import attrs

            info = attrs.evolve(info, vision=self._vision.info)
        if self._audio is not None:
            import attrs

            info = attrs.evolve(info, audio=self._audio.info)
        if any(self._encoder_paths.values()):
            import attrs

            info = attrs.evolve(info, **self._load_encoders())
        self._report(info, time.perf_counter() - t0, self.spec.blas, on_native)
        self._emit(StepEvents((Loaded(info),)))
        return scheduler

    def _load_model(self):
        """The model as the weight policy serves it (engine/weights.py), and
        its config (without the quantization block once dequantized)."""
        from . import audio_chat, load_progress, rope, weights
        from .towers import vlm_config
        from .towers.registry import audio_family, image_family

        model, config = rope.load(self._path, self.spec.rope, lazy=True)
        model, note = weights.apply(model, self.spec.weights)
        if self._lockstep is not None:  # before the weights are read: each rank reads its share
            from .distributed import share_tokens, split_model

            split_model(model, self._split_kind, self._lockstep.group)
            share_tokens(self._lockstep.group)
        load_progress.eval_with_progress(model.parameters(), log)
        if vlm_config.is_vlm(config):
            # the image tower takes the text model's served float type
            if self._vision is None and self.spec.images:
                self._vision = self._load_tower(image_family(config), model, config)
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
            config = vlm_config.flat_config(config)
        if audio_chat.is_audio_chat(config):
            # the audio tower takes the text model's served float type
            if self._audio is None and self.spec.images:
                self._audio = self._load_tower(audio_family(config), model, config)
                log.info("audio input: %s conformer, %d tokens per clip",
                         config["model_type"], self._audio.info.tokens_per_clip)
            config = audio_chat.flat_config(config)
        if self.spec.lora:
            from . import lora
            from .lora_files import read_adapter

            # after the weight policy: the adapters take the served dtype
            model = lora.install(model, [read_adapter(p) for p in self.spec.lora])
            log.info("LoRA: %d adapter(s) loaded: %s", len(self.spec.lora),
                     ", ".join(self.spec.lora))
        if note is not None:
            if self._weights_note is None:  # said once, not again at each wake
                log.info("%s", note)
            self._weights_note = note
        if weights.stored_form(model) is None:
            config = {k: v for k, v in config.items()
                      if k not in ("quantization", "quantization_config")}
        return model, config

    def _load_tower(self, family, model, config: dict):
        """The family's tower (towers/registry.py), in the text model's served
        float type (as stored when that is not a float type)."""
        import mlx.core as mx

        from .towers.registry import tower_class

        cls = tower_class(family)
        dtype = cls.text_dtype(model)
        return cls.load(self._path, config, dtype if mx.issubdtype(dtype, mx.floating) else None,
                        self.spec.image_budget)

    def _fit_blas(self, config: dict) -> None:
        import mlx.core as mx

        from .platform_report import fit_blas_threads

        if mx.default_device() == mx.cpu:
            line = fit_blas_threads(config)
            if line is not None and not self._blas_fitted:  # said once, not at each wake
                log.info("%s", line)
            self._blas_fitted = True

    def _asked_draft(self):
        """The draft model when -md asks for one (draft-simple), else None."""
        spec = self.spec.speculative
        if spec.draft_model is None or "draft-simple" not in spec.types:
            return None
        return self._load_draft(Path(spec.draft_model))

    def _load_draft(self, path: Path):
        """The draft as the weight policy serves it, like the target: a
        16-bit or quantized draft on MLX's own CPU kernels would cost more
        per step than the target it drafts for."""
        import mlx.core as mx
        from mlx_lm.utils import load_model

        from . import weights
        from .speculative.draft_model import cache_kinds

        draft, _ = load_model(path, lazy=True)
        kinds = cache_kinds(draft)
        if kinds != {"KVCache"}:
            raise ValueError(f"draft model {path}: its {', '.join(sorted(kinds))} layers cannot "
                             "be rolled back after a rejected draft; use a plain-attention "
                             "draft checkpoint")
        setting = self._draft_weights()
        draft, note = weights.apply(draft, setting)
        if note and setting != self.spec.weights:
            note += " (--weights auto keeps a draft on the native kernels)"
        mx.eval(draft.parameters())
        log.info("draft model loaded: %s (speculative types: %s)%s", path,
                 ",".join(self.spec.speculative.types), f"; draft {note}" if note else "")
        return draft

    def _draft_weights(self) -> str:
        """`--weights auto` times one product, and for a small draft the
        kernels and float32 are microseconds apart there, while the fused
        decoder layer saves most of a step on the kernels; a draft's
        rounding cannot change the output (every draft is verified), so
        `auto` keeps a draft on the kernels wherever they run."""
        from . import native, weights

        setting = self.spec.weights
        return weights.KEEP if setting == weights.AUTO and native.available() else setting

    def _new_scheduler(self, model):
        """A scheduler with a fresh prompt cache: the cache lives and dies with
        its scheduler, so an idle sleep frees both."""
        from .cache_disk import disk_tier
        from .prompt_cache import PromptCache, budget_from_mib
        from .scheduler import Scheduler
        from .speculative import build_chain

        # a pipeline's ranks hold different layers, so their KV bytes (the
        # prompt cache's budget) differ and so would its evictions
        cache_on = self.spec.cache_ram_mib != 0 and self._split_kind != "pipeline"
        return Scheduler(model, self.vocab, n_slots=self.spec.n_slots,
                         clock=self._lockstep.clock if self._lockstep is not None else None,
                         drafter=build_chain(self.spec.speculative, self._draft),
                         n_ctx_slot=self._n_ctx_slot,
                         kv_budget=self._n_ctx if self.spec.kv_unified else None,
                         clear_idle=self.spec.kv_unified and self.spec.cache_idle_slots
                         and cache_on,
                         batch_size=self.spec.batch_size, special=self.spec.special,
                         context_shift=self.spec.context_shift,
                         cache_reuse=self.spec.cache_reuse,
                         cont_batching=self.spec.cont_batching,
                         kv_types=self.spec.kv_types, n_adapters=len(self.spec.lora),
                         vision=self._vision, audio=self._audio,
                         prompt_cache=(PromptCache(budget_from_mib(self.spec.cache_ram_mib),
                                                   disk=disk_tier(*self.spec.cache_disk,
                                                                  self._lockstep))
                                       if cache_on else None))

    @staticmethod
    def _report(info: ModelInfo, seconds: float, blas: str, on_native: bool = False) -> None:
        """One readable load summary, then what the platform costs (if anything)."""
        import mlx.core as mx

        from .platform_report import describe

        device = "cpu" if mx.default_device() == mx.cpu else "gpu"
        platform, warning = describe(device, info.dtype, info.quantization, blas, on_native)
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

"""What the engine serves, read from the configuration once: `EngineSpec`.

The engine thread's every setting in one frozen record, built by
`EngineSpec.from_config` where the server starts (the bridge's engine
factory, a follower rank) and read by the loader and the serve loop; tests
build one directly with the fields they care about.
"""

from __future__ import annotations

import attrs

from ..config import RopeOverrides, ServerConfig
from ..protocol.kv_types import DEFAULT_PAIR as DEFAULT_KV
from ..protocol.speculative import SpecSettings


@attrs.frozen
class EngineSpec:
    model_path: str
    n_slots: int = 1
    ctx_size: int = 0                 # 0: the checkpoint's training context
    batch_size: int = 2048
    warmup: bool = True
    special: bool = False
    cache_ram_mib: int = 0            # 0 = no prompt cache, -1 = no limit
    # the prompt cache's disk tier (cache_disk.py): directory (None = off), MiB
    cache_disk: tuple[str | None, int] = (None, -1)
    sleep_idle_s: float | None = None  # None = never sleep
    context_shift: bool = False
    cache_reuse: int = 0              # --cache-reuse (named at load; requests carry their own)
    cont_batching: bool = True
    # one KV budget of the whole context shared by every slot (kv_budget.py);
    # False: each slot is capped at its even share
    kv_unified: bool = False
    # a task's start clears idle slots' retained tokens under unified KV
    # (needs the prompt cache, which is where their KV already went)
    cache_idle_slots: bool = True
    rope: RopeOverrides = RopeOverrides()
    # --override-kv (cli/override_kv.py): BOS / EOS handling (None: the tokenizer's)
    # and the training context (0: config.json's max_position_embeddings)
    specials: tuple[bool | None, bool | None] = (None, None)
    n_ctx_train: int = 0
    kv_types: tuple[str, str] = DEFAULT_KV
    blas: str = "auto"                # --blas, for the load summary's advice
    weights: str = "auto"             # --weights: auto | keep | float32
    # -m itself as an encoder ("embed" or "rank"), or None for a chat model
    encoder_only: str | None = None
    embedding_model: str | None = None
    reranker_model: str | None = None
    pooling: str | None = None        # --pooling (the embed role's); None = the checkpoint's
    embd_n_batch: int = 512
    speculative: SpecSettings = SpecSettings()
    lora: tuple[str, ...] = ()        # adapter paths, in id order (engine/lora.py)
    images: bool = True               # False (--no-mmproj): no image or audio tower is loaded
    # --image-min-tokens, --image-max-tokens (<= 0: the model's)
    image_budget: tuple[int, int] = (-1, -1)

    @classmethod
    def from_config(cls, cfg: ServerConfig) -> "EngineSpec":
        return cls(
            model_path=cfg.model, n_slots=cfg.slots, ctx_size=cfg.ctx_size,
            batch_size=cfg.batch_size, warmup=cfg.warmup, special=cfg.special,
            cache_ram_mib=cfg.cache_ram, cache_disk=(cfg.cache_disk, cfg.cache_disk_mib),
            sleep_idle_s=cfg.sleep_idle_seconds if cfg.sleep_idle_seconds >= 0 else None,
            context_shift=cfg.context_shift, cache_reuse=cfg.cache_reuse,
            cont_batching=cfg.cont_batching, kv_unified=cfg.unified_kv,
            cache_idle_slots=cfg.cache_idle_slots, rope=cfg.rope,
            specials=(cfg.add_bos, cfg.add_eos), n_ctx_train=cfg.n_ctx_train,
            kv_types=(cfg.cache_type_k, cfg.cache_type_v), blas=cfg.blas, weights=cfg.weights,
            encoder_only=(None if cfg.encoder_mode is None
                          else "rank" if cfg.rerank_mode else "embed"),
            embedding_model=cfg.embedding_model, reranker_model=cfg.reranker_model,
            pooling=None if cfg.pooling == "rank" else cfg.pooling,
            embd_n_batch=min(cfg.batch_size, cfg.ubatch_size),
            speculative=cfg.speculative,
            lora=tuple(path for path, _ in cfg.adapters),
            images=cfg.mmproj_auto,
            image_budget=(cfg.image_min_tokens, cfg.image_max_tokens))

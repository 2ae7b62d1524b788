"""The resolved, immutable server configuration.

`cli/` builds one `ServerConfig` from the command line and the environment
(command line beats environment, as upstream) and validates it before any
model is resolved or loaded.  Everything downstream reads this record only;
nothing re-reads argv or os.environ after startup.

A default that is also a native request field's (the sampling values,
n_predict, n_keep, cache_prompt, sse_ping_interval) is read from that
field's row in the native field table (protocol/fields.py), so each
is written once.
"""

from __future__ import annotations

from typing import Any

import attrs

from .protocol.sampler_names import DEFAULT_LETTERS, DEFAULT_NAMES
from .protocol.speculative import PRIORITY, NgramSizes, SpecSettings
from .protocol.fields import default as _row

_SPEC = SpecSettings()  # the speculative defaults' one home

UINT32_MAX = 0xFFFF_FFFF
RANDOM_SEED = UINT32_MAX  # llama.cpp's LLAMA_DEFAULT_SEED: "pick one at random"


def fold_seed(value: int) -> int:
    """Fold a seed into llama.cpp's uint32 space.

    -1 and 4294967295 mean "random"; other negatives wrap (-2 -> 4294967294),
    as a C++ int-to-uint32 conversion does.
    """
    return value & UINT32_MAX


@attrs.frozen
class SamplingDefaults:
    """Server-wide sampling defaults.

    `None` for temperature / top_k / top_p means "flag not given": the value
    then comes from the checkpoint's generation_config.json, falling back to
    upstream's default (a recorded by_design divergence, as in the spec).
    """

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float = _row("min_p")
    seed: int = _row("seed")          # RANDOM_SEED
    n_predict: int = _row("n_predict")
    # the rest of upstream's chain, upstream's defaults
    top_n_sigma: float = _row("top_n_sigma")
    xtc_probability: float = _row("xtc_probability")
    xtc_threshold: float = _row("xtc_threshold")
    typical_p: float = _row("typical_p")
    repeat_last_n: int = _row("repeat_last_n")
    repeat_penalty: float = _row("repeat_penalty")
    presence_penalty: float = _row("presence_penalty")
    frequency_penalty: float = _row("frequency_penalty")
    dry_multiplier: float = _row("dry_multiplier")
    dry_base: float = _row("dry_base")    # a flag value below 1.0 is ignored, as upstream
    dry_allowed_length: int = _row("dry_allowed_length")
    dry_penalty_last_n: int = _row("dry_penalty_last_n")
    dry_sequence_breakers: tuple[str, ...] | None = None   # None = upstream's set
    adaptive_target: float = _row("adaptive_target")
    adaptive_decay: float = _row("adaptive_decay")
    dynatemp_range: float = _row("dynatemp_range")
    dynatemp_exp: float = _row("dynatemp_exponent")
    mirostat: int = _row("mirostat")
    mirostat_eta: float = _row("mirostat_eta")
    mirostat_tau: float = _row("mirostat_tau")
    samplers: str = DEFAULT_NAMES
    sampler_seq: str = DEFAULT_LETTERS
    ignore_eos: bool = _row("ignore_eos")
    logit_bias: tuple[tuple[int, float], ...] = ()
    escape: bool = True               # -e: escapes in reverse_prompt and the breakers
    reverse_prompt: tuple[str, ...] = ()
    # the server's grammar: GBNF / JSON-schema text, or the files holding them
    grammar: str | None = None
    grammar_file: str | None = None
    json_schema: str | None = None
    json_schema_file: str | None = None


@attrs.frozen
class RopeOverrides:
    """--rope-* / --yarn-*, as given (None / upstream's sentinels = the
    checkpoint's own); engine/rope.py applies them to the model config."""

    scaling: str | None = None       # none | linear | yarn
    scale: float | None = None       # --rope-scale N (freq scale 1/N)
    freq_base: float | None = None
    freq_scale: float | None = None
    yarn_orig_ctx: int = 0
    yarn_ext_factor: float = -1.0
    yarn_attn_factor: float = -1.0
    yarn_beta_slow: float = -1.0
    yarn_beta_fast: float = -1.0

    @property
    def any(self) -> bool:
        return self != RopeOverrides()


@attrs.frozen
class ServerConfig:
    model: str
    host: str = "127.0.0.1"
    port: int = 8080
    ctx_size: int = 0            # 0 = the checkpoint's trained context
    n_parallel: int = -1         # -1 = auto (4 slots, as upstream)
    batch_size: int = 2048       # logical prefill chunk
    # -- context and batching --
    ubatch_size: int = 512       # accepted and reported; no MLX micro-batch
    context_shift: bool = False  # --context-shift: shift instead of stopping at the bound
    n_keep: int = _row("n_keep")  # --keep: the default n_keep (-1 = the whole prompt)
    cont_batching: bool = True   # -nocb: prompts wait while any slot decodes
    kv_unified: bool | None = None  # -kvu / -no-kvu; None: unset (see `unified_kv`)
    cache_idle_slots: bool = True   # --no-cache-idle-slots: idle slots keep their tokens
    rope: "RopeOverrides" = attrs.field(factory=lambda: RopeOverrides())
    # --override-kv's keys with an analogue (cli/override_kv.py); None / 0: the checkpoint's
    add_bos: bool | None = None      # tokenizer.ggml.add_bos_token
    add_eos: bool | None = None      # tokenizer.ggml.add_eos_token
    n_ctx_train: int = 0             # ARCH.context_length: the training context
    override_kv: tuple = ()          # every --override-kv occurrence as parsed (the above)
    aliases: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()   # informational, reported by /v1/models
    offline: bool = False        # never download (HF_HUB_OFFLINE for the process)
    api_keys: tuple[str, ...] = attrs.field(default=(), repr=False)
    warmup: bool = True
    special: bool = False        # -sp: render special tokens in generated text
    spm_infill: bool = False     # --spm-infill: /infill puts the suffix block first
    mmproj_auto: bool = True     # --no-mmproj: refuse every image part
    image_min_tokens: int = -1   # a dynamic-resolution image's token bounds (<= 0: the model's)
    image_max_tokens: int = -1
    verbose: bool = False
    timeout: int = 3600          # HTTP socket read/write timeout, seconds
    # -- transport, CORS, keys --
    reuse_port: bool = False
    ssl_key_file: str | None = None
    ssl_cert_file: str | None = None
    api_prefix: str = ""
    api_key_file: str | None = None   # its keys are already in api_keys
    cors_origins: str = "*"
    cors_methods: str = "GET, POST, DELETE, OPTIONS"
    cors_headers: str = "*"
    cors_credentials: bool = True
    # -- logging; log_file is the resolved destination, None = stdout --
    log_disable: bool = False
    log_file: str | None = None
    log_colors: str = "auto"
    log_verbosity: int = 3
    log_prefix: bool = True
    log_timestamps: bool = True
    # every value the log sinks redact (keys, key-file lines, HF tokens)
    secrets: tuple[str, ...] = attrs.field(default=(), repr=False)
    sse_ping_interval: int = _row("sse_ping_interval")  # seconds; <= 0 disables
    # -- prompt cache and slot files --
    cache_prompt: bool = _row("cache_prompt")  # the per-request cache_prompt default
    cache_reuse: int = _row("n_cache_reuse")  # --cache-reuse: the default n_cache_reuse
    cache_ram: int = 8192            # MiB; -1 = no limit, 0 = no prompt cache
    cache_ram_auto: bool = False     # --cache-ram not given: sized to the machine (memory_fit.py)
    cache_disk: str | None = None    # --cache-disk: the disk tier's directory (cache_disk.py)
    cache_disk_mib: int = 16384      # its budget; -1 = no limit
    cache_type_k: str = "f16"        # -ctk / -ctv: storage formats in kv_types.py
    cache_type_v: str = "f16"
    blas: str = "auto"               # --blas: auto | bundled | a library path (blas.py)
    weights: str = "auto"            # --weights: auto | keep | float32 (engine/weights.py)
    # --session-store: memory, or a redis:// URL shared by replicas (server/sessions/shared.py)
    session_store: str = attrs.field(default="memory", repr=False)
    # -- router mode (server/router/): no -m, models discovered and served by children --
    models_dir: str | None = None    # --models-dir, canonical (router mode: `router`)
    models_preset: str | None = None
    models_max: int = 4              # loaded at once; 0 = unlimited
    models_autoload: bool = True
    # --models-preset, read at startup (cli/presets.py): [*], then the model sections
    preset_global: Any = None
    presets: tuple = ()
    router: bool = False             # this process is the router
    hf_token: str | None = attrs.field(default=None, repr=False)  # the router's downloads
    model_store_root: str | None = None  # --model-store-root (model_store.py)
    child_args: tuple[str, ...] = () # the command line each model's server gets
    child_env_drop: frozenset[str] = frozenset()  # the variables it does not inherit
    # -- LoRA adapters (engine/lora.py) --
    lora: tuple[tuple[str, float], ...] = ()         # --lora, as given
    lora_scaled: tuple[tuple[str, float], ...] = ()  # --lora-scaled, as given
    lora_init_without_apply: bool = False            # every adapter starts at scale 0
    # both options' adapters in command-line order: (path, scale) by adapter id
    adapters: tuple[tuple[str, float], ...] = ()
    slot_save_path: str | None = None  # canonical directory; None = slot actions 501
    # -- media inputs (mlxcel_trio/media) --
    media_path: str | None = None    # canonical --media-path; None = file:// refused
    max_image_payload_size: int = 20 * 1024 * 1024  # bytes per media item
    max_images: int = 16             # media items per request
    # -- embeddings and reranking (engine/embedder.py) --
    embeddings: bool = False         # --embeddings: -m is an encoder, generation is off
    reranking: bool = False          # --reranking: -m is a cross-encoder, generation is off
    pooling: str | None = None       # --pooling; None = the checkpoint's (1_Pooling)
    embd_normalize: int = 2          # --embd-normalize: the requests' default
    embedding_model: str | None = None  # mlxcel: an embedding encoder beside the chat -m
    reranker_model: str | None = None   # mlxcel: a cross-encoder beside the chat -m
    # -- monitoring endpoints and idle sleep --
    endpoint_metrics: bool = False   # --metrics: GET /metrics
    endpoint_props: bool = False     # --props: POST /props
    endpoint_slots: bool = True      # --slots / --no-slots: GET /slots
    sleep_idle_seconds: int = -1     # < 0 = never sleep
    # -sm: how the model is split across mlx.launch's ranks (engine/distributed.py);
    # None = tensor parallel where the architecture has it, else the pipeline
    split_mode: str | None = None
    # -- the built-in web UI (server/surfaces/webui.py) --
    ui: bool = True                  # --ui / --no-ui: serve the page at /
    ui_config: str | None = None     # --ui-config, as given
    ui_config_file: str | None = None  # --ui-config-file, as given
    ui_settings: str = "{}"          # the JSON text in force (checked at startup), for /props
    # -- Vertex AI (AIP_MODE=PREDICTION; cli/vertex_env.py), None = not registered --
    aip_predict_route: str | None = None
    aip_health_route: str | None = None
    aip_replaced_port: int | None = None   # the --port AIP_HTTP_PORT replaced (warned)
    sampling: SamplingDefaults = SamplingDefaults()
    # -- speculative decoding (engine/speculative/); see `speculative` --
    spec_type: tuple[str, ...] = ("none",)
    spec_model: str | None = None            # -md, resolved to a local checkpoint
    spec_n_max: int = _SPEC.n_max            # the defaults are SpecSettings' own
    spec_n_min: int = _SPEC.n_min
    spec_p_min: float = _SPEC.p_min
    spec_ngram_simple_size_n: int = _SPEC.ngram_simple.size_n
    spec_ngram_simple_size_m: int = _SPEC.ngram_simple.size_m
    spec_ngram_simple_min_hits: int = _SPEC.ngram_simple.min_hits
    spec_ngram_map_k_size_n: int = _SPEC.ngram_map_k.size_n
    spec_ngram_map_k_size_m: int = _SPEC.ngram_map_k.size_m
    spec_ngram_map_k_min_hits: int = _SPEC.ngram_map_k.min_hits
    spec_ngram_map_k4v_size_n: int = _SPEC.ngram_map_k4v.size_n
    spec_ngram_map_k4v_size_m: int = _SPEC.ngram_map_k4v.size_m
    spec_ngram_map_k4v_min_hits: int = _SPEC.ngram_map_k4v.min_hits
    spec_ngram_mod_n_min: int = _SPEC.mod_n_min
    spec_ngram_mod_n_max: int = _SPEC.mod_n_max
    spec_ngram_mod_n_match: int = _SPEC.mod_n_match
    spec_lookup_cache_static: str | None = None    # -lcs, checked readable at startup
    spec_lookup_cache_dynamic: str | None = None   # -lcd
    # -- chat: templates, reasoning, parsing --
    chat_jinja: bool = True                  # --no-jinja is refused at startup
    chat_template: str | None = None         # --chat-template text (wins over the file)
    chat_template_file: str | None = None    # --chat-template-file path
    chat_template_kwargs: str | None = None  # JSON object text
    chat_reasoning_format: str = "auto"      # none | deepseek | deepseek-legacy | auto
    chat_reasoning: str = "auto"             # on | off | auto -> enable_thinking
    chat_reasoning_effort: str = "default"   # -> reasoning_effort ("default": unset)
    chat_reasoning_preserve: bool | None = None  # -> preserve_reasoning (None: unset)
    chat_skip_chat_parsing: bool = False
    chat_prefill_assistant: bool = True
    chat_reasoning_budget: int = -1          # thinking tokens before a forced close; -1 = none
    chat_reasoning_budget_message: str | None = None  # forced in before the closing marker
    chat_reasoning_alias_field: str = "reasoning"  # mlxcel: also emit reasoning_content as this
    # The -m value as the operator gave it ("mlx-community/Qwen3-0.6B-bf16");
    # `model` is the local checkpoint directory it resolved to.  None when
    # the config was built by hand rather than by cli/.
    model_ref: str | None = None
    # Tuning options given with a value that asks for something, as the
    # operator wrote them ("--threads '8'", "--mlock"): logged once at startup
    # as having no effect on MLX.
    no_effect: tuple[str, ...] = ()

    @property
    def rerank_mode(self) -> bool:
        """--reranking, or --embeddings with --pooling rank (upstream's two
        ways onto its reranking path)."""
        return self.reranking or (self.embeddings and self.pooling == "rank")

    @property
    def encoder_mode(self) -> str | None:
        """The flag that makes -m an encoder with generation off, or None."""
        if self.rerank_mode:
            return "--reranking"
        return "--embeddings" if self.embeddings else None

    @property
    def speculative(self) -> SpecSettings:
        """The drafters in force, in upstream's trial order (cli/ has already
        made -md given alone select draft-simple)."""
        types = tuple(t for t in PRIORITY if t in self.spec_type)
        return SpecSettings(
            types=types, n_max=self.spec_n_max, n_min=self.spec_n_min,
            p_min=self.spec_p_min, draft_model=self.spec_model,
            ngram_simple=NgramSizes(self.spec_ngram_simple_size_n,
                                    self.spec_ngram_simple_size_m,
                                    self.spec_ngram_simple_min_hits),
            ngram_map_k=NgramSizes(self.spec_ngram_map_k_size_n, self.spec_ngram_map_k_size_m,
                                   self.spec_ngram_map_k_min_hits),
            ngram_map_k4v=NgramSizes(self.spec_ngram_map_k4v_size_n,
                                     self.spec_ngram_map_k4v_size_m,
                                     self.spec_ngram_map_k4v_min_hits),
            mod_n_min=self.spec_ngram_mod_n_min, mod_n_max=self.spec_ngram_mod_n_max,
            mod_n_match=self.spec_ngram_mod_n_match,
            lookup_static=self.spec_lookup_cache_static,
            lookup_dynamic=self.spec_lookup_cache_dynamic)

    @property
    def slots(self) -> int:
        """The resolved slot count: upstream's auto (-1) is 4."""
        return 4 if self.n_parallel < 0 else self.n_parallel

    @property
    def unified_kv(self) -> bool:
        """Whether the context is one KV budget shared by every slot:
        upstream's auto slot count turns it on whatever -kvu says, and an
        explicit count leaves it to -kvu (off when not given)."""
        return self.n_parallel < 0 or bool(self.kv_unified)

    @property
    def model_alias(self) -> str | None:
        """The served model name: upstream keeps aliases in a std::set and
        serves the first, so sort them the same way."""
        return sorted(self.aliases)[0] if self.aliases else None

"""Before anything loads: can the engine serve this configuration?

Asked by the runner before the server listens, so that a checkpoint mlx-lm
cannot build, an option the checkpoint cannot honor or a split the ranks
cannot make fails at once, naming the option, the value and what to do
instead, and no weight is read in vain.  Also the distributed planning: this
process's place among the ranks, the split, and joining the others.  Only
configs are read here (every heavy import is inside its function).
"""

from __future__ import annotations

import logging

from ..config import ServerConfig
from ..protocol.kv_types import DEFAULT_PAIR as DEFAULT_KV

log = logging.getLogger("mlxcel.engine")


def mlx_lm_problem() -> str | None:
    """Why the installed mlx-lm lacks an internal the engine builds on
    (engine/mlx_lm_internals.py), or None."""
    from .mlx_lm_internals import MlxLmUnsupported, check

    try:
        check()
    except MlxLmUnsupported as exc:
        return str(exc)
    return None


def checkpoint_problem(cfg: ServerConfig) -> str | None:
    """Why the engine could not build the configured checkpoint with its KV
    cache types (one line), or None."""
    problem = image_budget_problem(
        cfg.model, cfg.model_ref or cfg.model, (cfg.image_min_tokens, cfg.image_max_tokens))
    if problem is not None:
        return problem
    if serves_speech(cfg.model):
        return _whisper_problem(cfg)
    for path, flag, rank in ((cfg.embedding_model, "--embedding-model", False),
                             (cfg.reranker_model, "--reranker-model", True)):
        if path is not None and cfg.encoder_mode == ("--reranking" if rank else "--embeddings"):
            return (f"{flag} names a second model for what -m already serves with "
                    f"{cfg.encoder_mode}; give one of them")
        if path is not None:
            problem = model_problem(path, encoder_flag=flag, rank=rank)
            if problem is not None:
                return problem
    if cfg.spec_model is not None and cfg.encoder_mode is None:
        problem = model_problem(cfg.spec_model)
        if problem is not None:
            return f"draft model (-md): {problem}"
    problem = model_problem(cfg.model, (cfg.cache_type_k, cfg.cache_type_v),
                            cfg.encoder_mode, rank=cfg.rerank_mode)
    if problem is None and cfg.adapters:
        problem = adapter_problem(tuple(p for p, _ in cfg.adapters), cfg.encoder_mode)
    return problem


def _whisper_problem(cfg: ServerConfig) -> str | None:
    """A Whisper -m serves transcription alone: the options that need a
    chat model or an encoder beside it are refused by name."""
    for present, flag in ((cfg.encoder_mode is not None, cfg.encoder_mode),
                          (cfg.embedding_model is not None, "--embedding-model"),
                          (cfg.reranker_model is not None, "--reranker-model"),
                          (cfg.spec_model is not None, "-md/--model-draft"),
                          (bool(cfg.adapters), "--lora")):
        if present:
            return (f"-m names a Whisper (speech-to-text) checkpoint, which serves "
                    f"/v1/audio/transcriptions alone; {flag} needs a chat or encoder model: "
                    f"drop {flag}, or serve the Whisper model from a server of its own")
    import importlib.util

    missing = [m for m in ("soundfile", "scipy") if importlib.util.find_spec(m) is None]
    if missing:
        return (f"serving a Whisper checkpoint needs {' and '.join(missing)} to decode audio: "
                "install the media extra (pip install 'mlxcel-trio[media]')")
    return model_problem(cfg.model)


def model_problem(path: str, kv_types: tuple[str, str] = DEFAULT_KV,
                  encoder_flag: str | None = None, rank: bool = False) -> str | None:
    """Why mlx-lm could not build the checkpoint at `path` with these KV
    cache types, or None (see engine/architectures.py).  With `encoder_flag`
    (--embeddings / --reranking) `path` must be an encoder instead
    (engine/embedder.py)."""
    from .architectures import problem

    if encoder_flag is not None:
        from .embedder import checkpoint_problem as encoder_problem

        return encoder_problem(path, encoder_flag, rank=rank)
    from .stt.transcriber import checkpoint_problem as stt_problem, is_whisper

    if is_whisper(path):
        return stt_problem(path)

    return problem(path, kv_types)


def image_budget_problem(path: str, name: str, budget: tuple[int, int]) -> str | None:
    """Why --image-min-tokens / --image-max-tokens cannot be honored on
    the checkpoint at `path`, or None (engine/vision.py)."""
    from .vision import budget_problem

    return budget_problem(path, name, *budget)


def serves_speech(path: str) -> bool:
    """Whether the checkpoint at `path` is a speech-to-text model (a
    Whisper checkpoint), which the engine serves without a chat model."""
    from .stt.transcriber import is_whisper

    return is_whisper(path)


def input_modalities(path: str, media: bool = True) -> tuple[str, ...]:
    """What the checkpoint at `path` takes, from its config.json alone (the
    router lists it before any model loads): "text", then "image" for an
    integrated VLM of a family served here and "audio" for a chat model with
    an audio tower, by the same tests the loader builds those towers by
    (loading.py), and "audio" for a Whisper checkpoint.  With `media` False
    (--no-mmproj) no tower is built, so a chat model takes text alone, as
    its /props modalities then say.  An unreadable config is text alone."""
    import json
    from pathlib import Path

    from .audio_chat import is_audio_chat
    from .towers.vlm_config import is_vlm

    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return ("text",)
    if not isinstance(config, dict):
        return ("text",)
    out = ["text"]
    if media and is_vlm(config):
        out.append("image")
    if (media and is_audio_chat(config)) or serves_speech(path):
        out.append("audio")
    return tuple(out)


def adapter_problem(paths: tuple[str, ...], encoder_flag: str | None = None) -> str | None:
    """Why LoRA adapters at `paths` cannot be served (every problem, one
    line each), from their configs alone; None when they can be loaded."""
    if encoder_flag is not None:
        return (f"--lora applies to a generating model; {encoder_flag} serves an "
                "encoder: drop one of them")
    from .lora_files import adapter_problem as one_problem

    problems = [p for p in map(one_problem, paths) if p is not None]
    return "; ".join(f"LoRA adapter {p}" for p in problems) or None


# -- several ranks (engine/distributed.py) -----------------------------------------

def world():
    """This process's place among the ranks mlx.launch started (one of one
    when started alone)."""
    from .distributed import World

    return World.from_env()


def distributed_problem(cfg: ServerConfig, world) -> tuple[str | None, str | None]:
    """(problem, split kind: "tensor" or "pipeline") for serving `cfg` across
    `world`'s ranks; asked before the server listens and before any weight
    is read."""
    from .distributed import plan

    try:
        return None, plan(cfg, world)
    except ValueError as exc:
        return str(exc), None


def join_world(world, split_kind: str) -> tuple:
    """Join the other ranks (blocks until all have): (the lockstep channel,
    split kind), the engine's `distributed` argument."""
    from .distributed import Lockstep, init_group

    lockstep = Lockstep(init_group(world))
    if lockstep.ring_doorbell():
        log.info("rank %d of %d: followers wait on a doorbell while rank 0 is idle",
                 world.rank, world.size)
    else:
        log.info("rank %d of %d: no doorbell (not a ring hostfile); followers poll "
                 "while rank 0 is idle", world.rank, world.size)
    return lockstep, split_kind

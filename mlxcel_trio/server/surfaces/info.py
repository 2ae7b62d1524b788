"""GET /health, /props, /models, /v1/models, /slots, POST /props: what the server is.

None of these reads the model: they answer from the config, the tokenizer,
the chat template and the bridge's monitor, so they keep answering while
the engine sleeps (--sleep-idle-seconds).  /health, /props and the model
lists never wake it; /slots and POST /props wait for a reload first, as
upstream's do (protocol/routes.py `wakes`).
"""

from __future__ import annotations

import json
import os
import time

import attrs
from pathlib import Path
from typing import Any

from ...bridge import Bridge
from ...monitor import SlotView
from ...protocol.speculative import SpecSettings
from ..request.media_input import audio_of, vision_of
from ..request.served import Served
from ..request.schema import NativeRequest
from ..request.settings import generation_settings, reduced_settings
from ..http.errors import ApiError, json_response, not_supported

VOCAB_TYPE = {"byte_level": 2, "sentencepiece": 1}  # llama.cpp's BPE / SPM ids


def health():
    return json_response({"status": "ok"})


def _default_values(served: Served) -> NativeRequest:
    """What an empty request resolves to: the server's defaults record,
    with the LoRA scales in force now."""
    return attrs.evolve(served.defaults, lora=served.state.adapters.scales)


FTYPE_NAMES = {"float32": "all F32", "float16": "F16", "bfloat16": "BF16"}


def ftype_name(info) -> str:
    """llama.cpp's file-type name where one fits, else the MLX quantization."""
    if info.quantization:
        return f"MLX {info.quantization}"
    return FTYPE_NAMES.get(info.dtype, info.dtype.upper())


def props(served: Served):
    """get_res_props' keys in its order; the chat template and its caps are
    the ones in force (chat/settings.py), and chat_template_tool_use is
    added when the checkpoint has a separate tool-use template, as upstream."""
    bridge = served.bridge
    info, vocab = bridge.info, bridge.vocab
    chat = served.state.chat_settings()
    res = {
        "default_generation_settings": {"params": reduced_settings(
                                            _default_values(served), served.speculative.names),
                                        "n_ctx": info.n_ctx_slot},
        "total_slots": info.n_slots,
        "model_alias": served.model_name,
        "model_ftype": ftype_name(info),
        "model_path": info.path,
        "modalities": {"vision": vision_of(served) is not None, "video": False,
                       "audio": info.transcriber is not None or audio_of(served) is not None},
        "media_marker": served.state.media.marker,
        "endpoint_slots": bridge.config.endpoint_slots,
        "endpoint_props": bridge.config.endpoint_props,
        "endpoint_metrics": bridge.config.endpoint_metrics,
        "ui": bridge.config.ui,
        "ui_settings": json.loads(bridge.config.ui_settings),
        "chat_template": chat.template.source,
        "chat_template_caps": chat.caps,
        "bos_token": vocab.bos_token or "",
        "eos_token": vocab.eos_token or "",
        "build_info": served.build_info,
        "is_sleeping": bridge.sleeping,
        "cors_proxy_enabled": False,
    }
    if chat.template.tool_use_source:
        res["chat_template_tool_use"] = chat.template.tool_use_source
    res["prompt_cache"] = prompt_cache_props(bridge)
    # our extensions, after upstream's keys: the resolved geometry and sleep window
    cfg = bridge.config
    res["geometry"] = {"n_ctx": info.n_ctx, "n_ctx_slot": info.n_ctx_slot,
                       "n_slots": info.n_slots, "n_batch": cfg.batch_size,
                       # -ub: no MLX micro-batch; it bounds an embedding input's length
                       "n_ubatch": cfg.ubatch_size, "cont_batching": cfg.cont_batching,
                       "context_shift": cfg.context_shift,
                       # one KV budget of n_ctx shared by every slot (engine/kv_budget.py)
                       "kv_unified": info.kv_unified}
    res["sleep_idle_seconds"] = cfg.sleep_idle_seconds
    res["capabilities"] = capabilities_props(served)
    return json_response(res)


def capabilities_props(served: Served) -> dict:
    """mlxcel extension: what the server resolved: whether it generates,
    the flag that turned generation off, and each encoder with the pooling
    and embd_normalize really in force."""
    info, cfg = served.bridge.info, served.bridge.config

    def model_id(side) -> str:
        return served.model_name if _is_m(info, side) else Path(side.path).name

    emb, rr = info.embedder, info.reranker
    return {
        "generation": info.generates,
        "restricted_by": None if info.generates else cfg.encoder_mode,
        "embedding": None if emb is None else {"model": model_id(emb), "pooling": emb.pooling,
                                               "embd_normalize": cfg.embd_normalize},
        "rerank": None if rr is None else {"model": model_id(rr), "pooling": rr.pooling},
    }


def prompt_cache_props(bridge: Bridge) -> dict:
    """mlxcel extension: the prompt cache's budget and what it holds now."""
    mib = bridge.config.cache_ram
    st = bridge.cache_stats
    return {
        "enabled": mib != 0,
        "budget_bytes": -1 if mib < 0 else mib * 1024 * 1024,
        "entries": st.entries if st else 0,
        "bytes": st.bytes if st else 0,
        "peak_bytes": st.peak_bytes if st else 0,
        "hits": st.hits if st else 0,
        "misses": st.misses if st else 0,
    }


def _created(path: str) -> int:
    try:
        return int(os.stat(path).st_mtime)
    except OSError:
        return int(time.time())


def _is_m(info, side) -> bool:
    """Whether an encoder the engine serves is -m itself (--embeddings /
    --reranking) rather than a side model."""
    return not info.generates and Path(side.path) == Path(info.path)


def capabilities(info) -> list[str]:
    """What -m answers: completion (a chat model), transcription (a Whisper
    checkpoint), or, served alone with --embeddings / --reranking, embedding
    or rerank."""
    if info.generates:
        # upstream adds "multimodal" when a projector is loaded
        media = info.vision is not None or info.audio is not None
        return ["completion", "multimodal"] if media else ["completion"]
    if info.transcriber is not None:
        return ["transcription"]
    return ["embedding" if info.embedder is not None and _is_m(info, info.embedder)
            else "rerank"]


def side_models(info) -> list[tuple[str, Any, str]]:
    """The encoders served beside -m (--embedding-model, --reranker-model):
    (id, EmbedderInfo, capability) each; the id is the checkpoint
    directory's name."""
    return [(Path(side.path).name, side, cap)
            for side, cap in ((info.embedder, "embedding"), (info.reranker, "rerank"))
            if side is not None and not _is_m(info, side)]


def models(served: Served, aliases: tuple[str, ...], tags: tuple[str, ...] = ()):
    info, vocab = served.bridge.info, served.bridge.vocab
    name = served.model_name
    quant = ftype_name(info)
    return json_response({
        "models": [{
            "name": name, "model": name, "modified_at": "", "size": str(info.size_bytes),
            "digest": "", "type": "model", "description": "", "tags": [""],
            "capabilities": capabilities(info), "parameters": "",
            "details": {"parent_model": "", "format": "safetensors", "family": info.model_type,
                        "families": [info.model_type], "parameter_size": str(info.n_params),
                        "quantization_level": quant},
        }, *({"name": sid, "model": sid, "modified_at": "", "size": "", "digest": "",
              "type": "model", "description": "", "tags": [""], "capabilities": [cap],
              "parameters": "", "details": {"parent_model": "", "format": "safetensors",
                                            "family": side.architecture,
                                            "families": [side.architecture],
                                            "parameter_size": "", "quantization_level": ""}}
             for sid, side, cap in side_models(info))],
        "object": "list",
        "data": [{
            "id": name,
            # upstream makes the model's name its alias when none is given
            "aliases": sorted(aliases) or [name],
            "tags": list(tags),
            "object": "model",
            "created": _created(info.path),
            "owned_by": "llamacpp",
            "meta": {
                "vocab_type": VOCAB_TYPE.get(vocab.table.kind, 0),
                "n_vocab": info.n_vocab,
                "n_ctx": info.n_ctx,
                "n_ctx_train": info.n_ctx_train,
                "n_embd": info.n_embd,
                "n_params": info.n_params,
                "size": info.size_bytes,
                "ftype": quant,
            },
        }, *({"id": sid, "aliases": [sid], "tags": [], "object": "model",
              "created": _created(side.path), "owned_by": "llamacpp",
              "capabilities": [cap],
              "meta": {"n_vocab": side.n_vocab, "n_ctx_train": side.n_ctx_train,
                       "n_embd": side.n_embd, "pooling": side.pooling}}
             for sid, side, cap in side_models(info))],
    })


def set_props(config):
    """POST /props: upstream's handler acknowledges and changes nothing."""
    if not config.endpoint_props:
        return not_supported("changing global properties", "--props")
    return json_response({"success": True})


def _slot_json(view: SlotView, n_ctx: int, debug: bool, vocab, spec: SpecSettings) -> dict:
    """server_slot::to_json: the last job stays on an idle slot."""
    entry = {"id": view.id, "n_ctx": n_ctx, "speculative": spec.on,
             "is_processing": view.processing}
    if view.job_id is None:
        return entry
    job = view.job
    values = job.settings if job is not None else None
    if values is None:
        params = {}
    else:
        params = (generation_settings(values, spec.names) if debug
                  else reduced_settings(values, spec.names))
    entry.update({
        "id_task": view.job_id,
        "n_prompt_tokens": view.n_prompt,
        "n_prompt_tokens_processed": view.n_processed,
        "n_prompt_tokens_cache": view.n_cache,
        "params": params,
        "next_token": [{
            "has_next_token": view.processing,
            "has_new_line": view.has_new_line,
            "n_remain": view.n_remain,
            "n_decoded": view.n_decoded,
        }],
    })
    if debug:
        entry["prompt"] = vocab.detokenize(list(job.prompt)) if job is not None else ""
        entry["generated"] = "".join(view.pieces or ())
    return entry


def slots(bridge: Bridge, query):
    """GET /slots; prompt and generated text only under LLAMA_SERVER_SLOTS_DEBUG."""
    if not bridge.config.endpoint_slots:
        return not_supported("slots endpoint", "--slots")
    monitor = bridge.monitor
    if query.get("fail_on_no_slot") and monitor.n_idle == 0:
        raise ApiError("no slot available", "unavailable_error")
    n_ctx = bridge.info.n_ctx_slot
    spec = bridge.config.speculative
    return json_response([_slot_json(v, n_ctx, monitor.debug, bridge.vocab, spec)
                          for v in monitor.slots])

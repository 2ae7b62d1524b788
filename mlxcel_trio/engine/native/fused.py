"""A llama / qwen2 / qwen3 decoder layer as one native graph node for a
decode step (graph.cpp, NativeFusedLayer): norms, projections, RoPE, the KV
cache update, attention, the MLP and both residuals in one task instead of
~30 MLX nodes.  `install(model)` swaps the class of each eligible
TransformerBlock for a subclass that tries the node first and runs the
block as mlx-lm wrote it for anything the node does not cover (prefill,
LoRA-wrapped projections, another cache kind, a mask it cannot express, an
unevaluated weight, ...).  MLXCEL_NATIVE_FUSED=0 leaves the blocks alone.
See docs/kernels.md.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import mlx.core as mx
from mlx import nn

from . import library

ENV = "MLXCEL_NATIVE_FUSED"
FAMILIES = ("mlx_lm.models.llama", "mlx_lm.models.qwen2", "mlx_lm.models.qwen3")
MAX_TOKENS = 4          # per sequence: a decode step (or a few draft tokens)
MAX_ROWS = 16           # tokens in all, as the products' kernels take them
N_ARRAYS = 10 + 4 * 7   # graph.cpp's mlxg_fused_layer layout
_ARRS = ctypes.c_void_p * N_ARRAYS
_OUTS = ctypes.c_void_p * 3
_IP = ctypes.c_int * 22
_FP = ctypes.c_float * 6


def enabled() -> bool:
    return os.environ.get(ENV, "").strip().lower() not in ("0", "off", "false", "no")


def _native_form(m: Any) -> str | None:
    """Which of layers.py's classes the module is, by the tag each carries
    (layers.py installs this module, so this one does not import it)."""
    return type(m).__dict__.get("native_form")


def _proj(m: Any) -> tuple[tuple, int, int] | None:
    """A projection's arrays (weight, scales, biases, bias), bits, group."""
    form = _native_form(m)
    if form == "linear":
        return (m["weight"], None, None, m.get("bias")), 16, 0
    if form == "quantized_linear":
        return (m["weight"], m["scales"], m["biases"], m.get("bias")), m.bits, m.group_size
    return None


def _norm(m: Any) -> tuple[mx.array, float] | None:
    if (type(m) is nn.RMSNorm or _native_form(m) == "rms_norm") and m["weight"].dtype == mx.float32:
        return m["weight"], float(m.eps)
    return None


def _rope(r: Any) -> tuple[int, bool, float, float, mx.array | None] | None:
    """dims, traditional, base, scale, freqs of a rotation the node computes."""
    if (type(r) is nn.RoPE or _native_form(r) == "rope") and r.base:
        return r.dims, bool(r.traditional), float(r.base), float(r.scale), None
    if type(r).__name__ == "Llama3RoPE" and r._freqs.dtype == mx.float32:
        return r.dims, bool(r.traditional), 0.0, 1.0, r._freqs
    return None


def _cache_args(cache: Any, mask: Any, tokens: int) -> tuple[int, int, bool] | None:
    """(write position, RoPE offset, batch) for a cache and mask the node
    expresses; None otherwise."""
    from mlx_lm.models.cache import BatchKVCache, KVCache

    t = type(cache)
    if t is KVCache:
        if not ((mask is None and tokens == 1) or (isinstance(mask, str) and mask == "causal")):
            return None
        return cache.offset, cache.offset, False
    if t is BatchKVCache:
        # its mask is the cache's own (causal from _idx, left padding), which
        # the node recomputes; right padding exists only during a prefill
        if cache._right_padding is not None or not (mask is None or isinstance(mask, mx.array)):
            return None
        return cache._idx, 0, True
    return None


def fused_call(block: Any, x: mx.array, mask: Any, cache: Any) -> mx.array | None:
    """The block's output through the node, the cache updated; None (nothing
    changed) where the node does not take this call."""
    g = library._graph
    if g is None or cache is None or x.ndim != 3 or x.dtype != mx.float32:
        return None
    B, L, _ = x.shape
    if L > MAX_TOKENS or B * L > MAX_ROWS:
        return None
    where = _cache_args(cache, mask, L)
    keys, values = getattr(cache, "keys", None), getattr(cache, "values", None)
    if where is None or keys is None or keys.dtype != mx.float32 or where[0] + L > keys.shape[2]:
        return None
    idx, offset, batch = where
    attn, mlp = block.self_attn, block.mlp
    ln_in, ln_post = _norm(block.input_layernorm), _norm(block.post_attention_layernorm)
    rope = _rope(attn.rope)
    if ln_in is None or ln_post is None or rope is None:
        return None
    qk = (None, None, 0.0)
    if "q_norm" in attn:
        qn, kn = _norm(attn["q_norm"]), _norm(attn["k_norm"])
        if qn is None or kn is None:
            return None
        qk = (qn[0], kn[0], qn[1])
    projs = [_proj(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
                                mlp.gate_proj, mlp.up_proj, mlp.down_proj)]
    if any(p is None for p in projs):
        return None
    dims, traditional, base, rscale, freqs = rope
    head_dim = keys.shape[3]
    arrays = [x, ln_in[0], ln_post[0], qk[0], qk[1], freqs, keys, values,
              cache.offset if batch else None, cache.left_padding if batch else None]
    ip = [attn.n_heads, attn.n_kv_heads, head_dim, dims, int(traditional), idx, offset,
          int(batch)]
    for arrs, bits, group in projs:
        arrays.extend(arrs)
        ip += (bits, group)
    outs = [mx.array(0.0), mx.array(0.0), mx.array(0.0)]
    rc = g.mlxg_fused_layer(_OUTS(*map(id, outs)),
                            _ARRS(*(None if a is None else id(a) for a in arrays)), _IP(*ip),
                            _FP(ln_in[1], ln_post[1], qk[2], rscale, base, attn.scale))
    if rc != 0:
        return None
    y, cache.keys, cache.values = outs
    if batch:
        cache.offset = cache.offset + L
        cache._idx += L
    else:
        cache.offset += L
    return y


_classes: dict[type, type] = {}


def _fused_class(cls: type) -> type:
    if cls not in _classes:
        def __call__(self, x, mask=None, cache=None):
            y = fused_call(self, x, mask, cache)
            return y if y is not None else cls.__call__(self, x, mask, cache)

        _classes[cls] = type(f"Fused{cls.__name__}", (cls,),
                             {"__call__": __call__, "__module__": cls.__module__,
                              "unfused_class": cls})
    return _classes[cls]


def _eligible(m: Any) -> bool:
    cls = type(m)
    if cls.__name__ != "TransformerBlock" or cls.__module__ not in FAMILIES:
        return False
    if getattr(m, "use_sliding", False):        # a window: a mask the node does not apply
        return False
    attn, mlp = m.get("self_attn"), m.get("mlp")
    need = ("q_proj", "k_proj", "v_proj", "o_proj", "rope")
    return (attn is not None and mlp is not None and all(k in attn or hasattr(attn, k) for k in need)
            and all(k in mlp for k in ("gate_proj", "up_proj", "down_proj"))
            and all(hasattr(attn, k) for k in ("n_heads", "n_kv_heads", "scale"))
            and "input_layernorm" in m and "post_attention_layernorm" in m)


def install(model: nn.Module) -> int:
    """Swap eligible decoder layers' classes; returns how many (0 when
    turned off)."""
    if not enabled():
        return 0
    n = 0
    for _, m in model.named_modules():
        if _eligible(m):
            m.__class__ = _fused_class(type(m))
            n += 1
    return n


def installed(model: nn.Module) -> int:
    return sum(type(m) in _classes.values() for _, m in model.named_modules())


def counts() -> tuple[int, int, int]:
    """Fused nodes evaluated, caches reused in place, caches copied (this
    process, all layers)."""
    out = (ctypes.c_long * 3)()
    library._graph.mlxg_fused_counts(out)
    return out[0], out[1], out[2]

"""Upstream's KV cache types (-ctk / -ctv and the draft variants), as MLX
stores them: the one table from name to storage format.

Light on purpose (attrs only): the command line validates names and pairs
with it before anything loads, and the engine builds its caches from it.

GGML's block quantizers become MLX's affine quantization with groups of 32
along the head dimension (GGML's blocks are 32 wide too); the bit width is
the block's.  MLX keeps a scale and a bias per group in the model's float
type, so every 4-bit type (symmetric q4_0, affine q4_1, non-linear iq4_nl)
lands on the same affine 4-bit format, and q5_0 / q5_1 on 5 bits.

f16, upstream's default, keeps the cache in the model's own float type (a
float16 cache beside a float32 model would convert every cached position at
every step); f32 and bf16 select that storage type.
"""

from __future__ import annotations

import attrs

GROUP_SIZE = 32  # MLX's smallest quantization group; GGML's block width


@attrs.frozen
class KvFormat:
    """How one of K or V is stored."""

    dtype: str | None = None
    """A float storage type ("float32", "bfloat16"); None: the model's own."""
    bits: int | None = None
    """Quantized: bits per element (MLX affine quantization); None: float."""
    group_size: int = GROUP_SIZE

    @property
    def quantized(self) -> bool:
        return self.bits is not None

    def describe(self) -> str:
        if self.quantized:
            return f"{self.bits}-bit groups of {self.group_size}"
        return self.dtype or "the model's float type"


KV_CACHE_TYPES: dict[str, KvFormat] = {
    "f32": KvFormat(dtype="float32"),
    "f16": KvFormat(),
    "bf16": KvFormat(dtype="bfloat16"),
    "q8_0": KvFormat(bits=8),
    "q4_0": KvFormat(bits=4),
    "q4_1": KvFormat(bits=4),
    "iq4_nl": KvFormat(bits=4),
    "q5_0": KvFormat(bits=5),
    "q5_1": KvFormat(bits=5),
}
DEFAULT = "f16"
DEFAULT_PAIR = (DEFAULT, DEFAULT)   # -ctk, -ctv as upstream starts


def pair_problem(k: str, v: str) -> str | None:
    """Why K type `k` and V type `v` cannot be served together, or None.

    MLX's quantized attention reads K and V in one format, so a quantized
    cache needs both quantized alike; float types mix freely."""
    fk, fv = KV_CACHE_TYPES[k], KV_CACHE_TYPES[v]
    if not (fk.quantized or fv.quantized):
        return None
    if fk.quantized and fv.quantized and fk.bits == fv.bits and fk.group_size == fv.group_size:
        return None
    return (f"K as {k} ({fk.describe()}) with V as {v} ({fv.describe()}): MLX's "
            f"quantized attention reads K and V in one format; give both the same "
            f"type, e.g. -ctk {k if fk.quantized else v} -ctv {k if fk.quantized else v}")


def head_problem(k: str, v: str, head_dim: int) -> str | None:
    """Why a model with attention heads of `head_dim` cannot hold this
    quantized cache, or None."""
    fmt = KV_CACHE_TYPES[k] if KV_CACHE_TYPES[k].quantized else KV_CACHE_TYPES[v]
    if not fmt.quantized or head_dim % fmt.group_size == 0:
        return None
    return (f"this model's attention heads are {head_dim} wide, not a multiple of "
            f"MLX's quantization group ({fmt.group_size}); use -ctk f16 -ctv f16")

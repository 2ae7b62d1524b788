"""The CPU weight policy (--weights): serve bf16 / f16 / quantized
checkpoints in float32 when that is faster here and fits.

On a CPU, MLX multiplies float32 through BLAS (multithreaded once OpenBLAS
is preloaded, see mlxcel_trio/blas.py) while its bf16, f16 and quantized
matmuls are its own generic kernels: measured on the 2-core Linux machine,
a Qwen3-0.6B-shaped model decodes at 3.2 tok/s in float32 with OpenBLAS,
1.2 in bf16 and 0.2 in 4-bit.  So `auto` converts at load, after checking
on this device with one of the model's own layers that float32 is really
faster, and that the float32 weights fit in the memory available with room
to spare.  `float32` converts without asking, `keep` never converts.  On a
GPU (Apple silicon, CUDA) `auto` keeps the weights as they are.

Conversion: quantized layers are dequantized with mlx-lm's own
`dequantize_model` (the same arithmetic as its dequantized forward); every
floating parameter is then cast to float32.  The model is loaded lazily
first, so the original weights are read from the file while the float32
ones are built, not held beside them.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import mlx.core as mx
from mlx import nn
from mlx.utils import tree_flatten

from ..memory_fit import available_bytes

log = logging.getLogger("mlxcel.engine")

AUTO, KEEP, FLOAT32 = "auto", "keep", "float32"
HEADROOM = 1 << 30          # memory left for the KV cache, activations and the rest
PROBE_ROUNDS = 8


def _floating(a: mx.array) -> bool:
    return mx.issubdtype(a.dtype, mx.floating)


def stored_form(model: nn.Module) -> str | None:
    """'bfloat16' / 'float16' / '4-bit' ... when the weights are not float32
    (the form the policy would convert), else None."""
    bits = {m.bits for _, m in model.named_modules() if hasattr(m, "bits") and hasattr(m, "scales")}
    if bits:
        return "/".join(f"{b}-bit" for b in sorted(bits))
    kinds = {str(p.dtype).removeprefix("mlx.core.") for _, p in tree_flatten(model.parameters())
             if _floating(p) and p.dtype != mx.float32}
    return "/".join(sorted(kinds)) or None


def float32_bytes(model: nn.Module) -> int:
    """The resident size of the weights once converted to float32."""
    modules = dict(model.named_modules())
    total = 0
    for name, p in tree_flatten(model.parameters()):
        if name.endswith((".scales", ".biases")):
            continue
        if p.dtype == mx.uint32:    # packed: 32 / bits values per word of its module
            total += p.size * (32 // modules[name.rsplit(".", 1)[0]].bits) * 4
        else:
            total += p.size * 4
    return total


def to_float32(model: nn.Module) -> nn.Module:
    from mlx_lm.utils import dequantize_model

    model = dequantize_model(model)
    model.update(_cast(model.parameters()))
    return model


def _cast(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _cast(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_cast(v) for v in tree]
    if isinstance(tree, mx.array) and _floating(tree) and tree.dtype != mx.float32:
        return tree.astype(mx.float32)
    return tree


def _probe_layer(model: nn.Module) -> nn.Module | None:
    """The largest linear layer: what decode time is made of."""
    best, size = None, 0
    for _, m in model.named_modules():
        if isinstance(m, (nn.Linear, nn.QuantizedLinear)) and m.weight.size > size:
            best, size = m, m.weight.size
    return best


def _time(f, x: mx.array) -> float:
    mx.eval(f(x))
    t0 = time.perf_counter()
    for _ in range(PROBE_ROUNDS):
        mx.eval(f(x))
    return (time.perf_counter() - t0) / PROBE_ROUNDS


def _float32_weight(layer: nn.Module) -> tuple[mx.array, Any]:
    if isinstance(layer, nn.QuantizedLinear):
        return (mx.dequantize(layer.weight, layer.scales, layer.biases, layer.group_size,
                              layer.bits, layer.mode).astype(mx.float32), layer.scales.dtype)
    return layer.weight.astype(mx.float32), layer.weight.dtype


def float32_is_faster(model: nn.Module) -> tuple[bool, str]:
    """Time one decode-shaped product of the largest layer as stored and in
    float32, on this device; (faster, the figures).  The model is not touched."""
    layer = _probe_layer(model)
    if layer is None:
        return True, "no linear layer to measure"
    w32, stored_dtype = _float32_weight(layer)
    x = mx.random.normal((1, w32.shape[1]))
    as_stored = _time(layer, x.astype(stored_dtype))
    as_f32 = _time(lambda v: v @ w32.T, x)
    return as_f32 < as_stored, (f"{as_stored * 1e3:.2f} ms as stored, {as_f32 * 1e3:.2f} ms "
                                "in float32 for the largest layer")


def native_is_faster(model: nn.Module) -> tuple[bool, str]:
    """The same measure for the native kernels against float32."""
    from .native import ops

    layer = _probe_layer(model)
    if layer is None:
        return False, "no linear layer to measure"
    w32, _ = _float32_weight(layer)
    x = mx.random.normal((1, w32.shape[1]))
    mx.eval(x, w32)
    if isinstance(layer, nn.QuantizedLinear):
        native = _time(lambda v: ops.gemm_affine(v, layer.weight, layer.scales, layer.biases,
                                                 layer.group_size, layer.bits), x)
    else:
        native = _time(lambda v: ops.gemm_16(v, layer.weight), x)
    as_f32 = _time(lambda v: v @ w32.T, x)
    return native < as_f32, (f"{native * 1e3:.2f} ms on the native kernels, {as_f32 * 1e3:.2f} "
                             "ms in float32 for the largest layer")


def _native(model: nn.Module, form: str, setting: str) -> tuple[bool, str]:
    """Put the model on the native CPU kernels when they can serve it (and,
    for `auto`, measure faster than float32); (installed, what was decided)."""
    from . import native
    from .native import layers

    if layers.eligible(model) == 0:
        return False, f"the native kernels do not take {form} layers"
    st = native.status()
    if not st.available:
        return False, f"native kernels unavailable: {st.detail}"
    figures = "--weights keep"
    if setting == AUTO:
        faster, figures = native_is_faster(model)
        if not faster:
            return False, f"the native kernels are not faster here ({figures})"
    n = layers.install(model)
    return True, (f"weights kept as {form} on the native CPU kernels ({st.detail}, "
                  f"{n} layers): {figures}; --weights float32 converts them")


def apply(model: nn.Module, setting: str) -> tuple[nn.Module, str | None]:
    """The model the policy serves, and one line on what it did (None when
    there was nothing to decide: float32 weights, or `keep` off the CPU)."""
    form = stored_form(model)
    if form is None:
        return model, None
    on_cpu = mx.default_device() == mx.cpu
    native_why = ""
    if on_cpu and setting in (AUTO, KEEP):
        installed, why = _native(model, form, setting)
        if installed:
            return model, why
        native_why = f"; {why}"
    if setting == KEEP:
        return model, (f"weights kept as {form} on MLX's own kernels{native_why}"
                       if on_cpu else None)
    if setting == AUTO:
        if not on_cpu:
            return model, None
        need, have = float32_bytes(model), available_bytes()
        if have is not None and need + HEADROOM > have:
            return model, (f"weights kept as {form}: float32 would need {need / 2**30:.1f} GiB "
                           f"and {have / 2**30:.1f} GiB is available (--weights float32 forces "
                           f"it){native_why}")
        faster, figures = float32_is_faster(model)
        if not faster:
            return model, (f"weights kept as {form}: float32 is not faster here "
                           f"({figures}){native_why}")
        why = f"float32 is faster on this CPU ({figures}){native_why}"
    else:
        why = "--weights float32"
    t0 = time.perf_counter()
    model = to_float32(model)
    mx.eval(model.parameters())
    return model, (f"weights converted from {form} to float32 in "
                   f"{time.perf_counter() - t0:.1f} s: {why}; --weights keep serves them as stored")

"""The KV cache type table: which -ctk / -ctv pairs and head widths MLX can hold."""

from __future__ import annotations

import itertools

import pytest

from mlxcel_trio.protocol.kv_types import KV_CACHE_TYPES, head_problem, pair_problem

UPSTREAM = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
FLOATS = ("f32", "f16", "bf16")


def test_every_upstream_name_has_a_format_in_upstream_order() -> None:
    assert tuple(KV_CACHE_TYPES) == UPSTREAM


@pytest.mark.parametrize(("name", "bits"), [("q8_0", 8), ("q4_0", 4), ("q4_1", 4),
                                            ("iq4_nl", 4), ("q5_0", 5), ("q5_1", 5)])
def test_block_quantizers_keep_their_bit_width_in_groups_of_32(name: str, bits: int) -> None:
    fmt = KV_CACHE_TYPES[name]
    assert (fmt.bits, fmt.group_size, fmt.dtype) == (bits, 32, None)


def test_f16_keeps_the_model_type_and_the_others_name_theirs() -> None:
    assert KV_CACHE_TYPES["f16"].dtype is None and not KV_CACHE_TYPES["f16"].quantized
    assert KV_CACHE_TYPES["f32"].dtype == "float32"
    assert KV_CACHE_TYPES["bf16"].dtype == "bfloat16"


@pytest.mark.parametrize(("k", "v"), list(itertools.product(UPSTREAM, repeat=2)))
def test_a_pair_is_servable_when_floats_or_quantized_alike(k: str, v: str) -> None:
    fk, fv = KV_CACHE_TYPES[k], KV_CACHE_TYPES[v]
    servable = (k in FLOATS and v in FLOATS) or (fk.quantized and fv.bits == fk.bits)
    reason = pair_problem(k, v)
    assert (reason is None) == servable, (k, v, reason)
    if reason is not None:
        q = k if fk.quantized else v
        assert reason.endswith(f"e.g. -ctk {q} -ctv {q}")


@pytest.mark.parametrize(("width", "ok"), [(16, False), (32, True), (64, True), (80, False),
                                           (96, True), (128, True)])
def test_quantized_types_need_heads_a_multiple_of_the_group(width: int, ok: bool) -> None:
    assert (head_problem("q8_0", "q8_0", width) is None) == ok
    assert head_problem("f16", "bf16", width) is None

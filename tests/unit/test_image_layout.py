"""An image's token run from its size alone (protocol/image_layout.py),
against values worked out by hand from upstream's calc_size_preserved_ratio
and HF's PixtralImageProcessor."""

from __future__ import annotations

import pytest

from mlxcel_trio.protocol.image_layout import (
    ImageGeometry,
    budget_pixels,
    longest_edge_size,
    preserved_ratio,
    resized,
)
from mlxcel_trio.protocol.records import VisionInfo


def test_a_token_budget_is_tokens_times_the_patch_area_with_pixtrals_defaults():
    assert budget_pixels(4, 9, 9) == (144, 144)
    # 0 and negative read the family's bounds: upstream's Pixtral 8..1024
    assert budget_pixels(16, 0, -1) == (8 * 256, 1024 * 256)
    assert budget_pixels(16, 64, 0) == (64 * 256, 1024 * 256)


@pytest.mark.parametrize("size, align, lo, hi, want", [
    # shrunk into max: beta = sqrt(24*30/144) = 2.236; floor(10.73/4)=2, floor(13.42/4)=3
    ((30, 24), 4, 144, 144, (12, 8)),
    # grown to min: 8x8 after rounding is 64 < 144; beta = sqrt(144/48) = 1.732
    ((8, 6), 4, 144, 144, (16, 12)),
    # a sliver grows past the tower's nominal size: ceil(16.97/4)=5 columns
    ((4, 2), 4, 144, 144, (20, 12)),
    # rounding is half away from zero (26/4 = 6.5 -> 7), not to even
    ((26, 8), 4, 0, 0, (28, 8)),
    # pixtral-12b's shape (16-pixel patches) under upstream's 8..1024 tokens
    ((1024, 768), 16, 8 * 256, 1024 * 256, (576, 432)),
    ((20, 20), 16, 8 * 256, 1024 * 256, (48, 48)),
    # within bounds: each side rounded to the patch, nothing else
    ((100, 50), 16, 8 * 256, 1024 * 256, (96, 48)),
])
def test_upstreams_size_preserving_resize(size, align, lo, hi, want):
    assert preserved_ratio(*size, align, lo, hi) == want


@pytest.mark.parametrize("size, edge, unit, want", [
    ((30, 24), 16, 4, (16, 12)),      # ratio 1.875: 16 x 12.8 -> 16 x 12
    ((8, 6), 16, 4, (8, 8)),          # never scaled up; 6 rounds up to 8
    ((1024, 768), 1024, 16, (1024, 768)),
    ((2048, 100), 1024, 16, (1024, 64)),
    ((5000, 1), 1024, 16, (1024, 16)),  # a sliver keeps one row
])
def test_the_checkpoints_longest_edge_resize(size, edge, unit, want):
    assert longest_edge_size(*size, edge, unit) == want


def test_pixtral_rows_end_in_break_and_the_last_in_end():
    info = VisionInfo(image_token=7, family="pixtral", geometry=ImageGeometry(4, 16),
                      break_token=8, end_token=9)
    # 30x24 -> 16x12 -> 3 rows of 4
    assert info.layout(30, 24) == (7, 7, 7, 7, 8, 7, 7, 7, 7, 8, 7, 7, 7, 7, 9)
    assert info.layout(4, 4) == (7, 9)
    budget = VisionInfo(image_token=7, family="pixtral",
                        geometry=ImageGeometry(4, 16, 144, 144), break_token=8, end_token=9)
    assert resized(budget.geometry, 30, 24) == (12, 8)
    assert budget.layout(30, 24) == (7, 7, 7, 8, 7, 7, 7, 9)


def test_a_fixed_geometry_family_takes_its_count_whatever_the_size():
    info = VisionInfo(image_token=5, tokens_per_image=3)
    assert info.layout(30, 24) == info.layout(1, 1) == (5, 5, 5)

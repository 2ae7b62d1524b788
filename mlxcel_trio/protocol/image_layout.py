"""How many prompt positions an image takes, and which: pure arithmetic on
its width and height, shared by the request path (which expands each
media marker into its image's run of token ids) and the engine (which
resizes the pixels to the same size and checks the run before prefill).

Two shapes exist.  A fixed-geometry family (llava: a square crop) takes
`tokens_per_image` copies of its placeholder, whatever the picture.  A
dynamic-resolution family (Pixtral) resizes each image keeping its aspect
ratio, aligned to `unit` pixels (patch size x spatial merge), and lays the
grid out as HF's PixtralProcessor does: each row is `cols` placeholders
then a break token, the last row ending in the end token instead; only the
placeholders take features.

The resize rule for a dynamic family is the checkpoint's own by default
(preprocessor_config.json's longest edge: downscale to fit, keep the ratio,
round each side up to a unit), or, when a token budget was given
(--image-min-tokens / --image-max-tokens), upstream's: the budget becomes
pixel bounds (tokens x unit^2) and the size-preserving resize of
tools/mtmd's calc_size_preserved_ratio applies, in its float32 arithmetic,
so a budget gives the grid llama-server gives.
"""

from __future__ import annotations

import math
import struct
from functools import lru_cache

import attrs

# upstream's PROJECTOR_TYPE_PIXTRAL bounds, in tokens: the one not given on
# the command line when the other is
PIXTRAL_MIN_TOKENS, PIXTRAL_MAX_TOKENS = 8, 1024


@attrs.frozen
class ImageGeometry:
    """A dynamic-resolution family's resize rule.  `unit`: the pixels one
    token side covers; `longest_edge`: the checkpoint's bound (0: none);
    `min_pixels` / `max_pixels`: a token budget's bounds, upstream's rule
    when either is positive (both are then set)."""

    unit: int
    longest_edge: int = 0
    min_pixels: int = 0
    max_pixels: int = 0

    @property
    def budgeted(self) -> bool:
        return self.min_pixels > 0 or self.max_pixels > 0


def budget_pixels(unit: int, min_tokens: int, max_tokens: int) -> tuple[int, int]:
    """Upstream's set_limit_image_tokens: a positive token count is a
    custom bound, anything else takes the family's default; each bound is
    tokens x patch area (unit^2)."""
    area = unit * unit
    lo = min_tokens if min_tokens > 0 else PIXTRAL_MIN_TOKENS
    hi = max_tokens if max_tokens > 0 else PIXTRAL_MAX_TOKENS
    return lo * area, hi * area


def _f32(x: float) -> float:
    """`x` rounded to a C float (upstream computes these sizes in float)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def _round_half_away(x: float) -> int:
    return math.floor(x + 0.5) if x >= 0 else -math.floor(-x + 0.5)


def preserved_ratio(width: int, height: int, align: int, min_pixels: int,
                    max_pixels: int) -> tuple[int, int]:
    """(width, height) as tools/mtmd's calc_size_preserved_ratio computes
    them (without its longest_edge step): each side rounded to `align`,
    then scaled down into `max_pixels` or up to `min_pixels`, the ratio
    kept.  Every float step is rounded to float32, as upstream's are."""
    if width <= 0 or height <= 0:
        return 0, 0
    f = _f32(align)

    def by(x: float, step) -> int:
        return int(step(_f32(x / f))) * align

    w_bar = max(align, by(_f32(width), _round_half_away))
    h_bar = max(align, by(_f32(height), _round_half_away))
    if max_pixels > 0 and h_bar * w_bar > max_pixels:
        beta = _f32(math.sqrt(_f32(_f32(_f32(height) * width) / _f32(max_pixels))))
        h_bar = max(align, by(_f32(height / beta), math.floor))
        w_bar = max(align, by(_f32(width / beta), math.floor))
    elif min_pixels > 0 and h_bar * w_bar < min_pixels:
        beta = _f32(math.sqrt(_f32(_f32(min_pixels) / _f32(_f32(height) * width))))
        h_bar = by(_f32(height * beta), math.ceil)
        w_bar = by(_f32(width * beta), math.ceil)
    return w_bar, h_bar


def longest_edge_size(width: int, height: int, longest_edge: int, unit: int) -> tuple[int, int]:
    """(width, height) as HF's PixtralImageProcessor resizes: scaled down
    (never up) to fit `longest_edge`, then each side rounded up to `unit`."""
    if longest_edge > 0:
        ratio = max(height / longest_edge, width / longest_edge)
        if ratio > 1:
            # at least one pixel: a sliver would otherwise lose its last row
            height = max(1, math.floor(height / ratio))
            width = max(1, math.floor(width / ratio))
    return (-(-width // unit) * unit, -(-height // unit) * unit)


def resized(geometry: ImageGeometry, width: int, height: int) -> tuple[int, int]:
    """The (width, height) the tower sees an image of this size at."""
    if geometry.budgeted:
        return preserved_ratio(width, height, geometry.unit, geometry.min_pixels,
                               geometry.max_pixels)
    return longest_edge_size(width, height, geometry.longest_edge, geometry.unit)


def grid(geometry: ImageGeometry, width: int, height: int) -> tuple[int, int]:
    """(rows, cols) of tokens for an image of this size."""
    w, h = resized(geometry, width, height)
    return h // geometry.unit, w // geometry.unit


@lru_cache(maxsize=1024)
def layout(image_token: int, tokens_per_image: int, geometry: ImageGeometry | None,
           break_token: int | None, end_token: int | None,
           width: int, height: int) -> tuple[int, ...]:
    """The token ids one image of this size takes in the prompt."""
    if geometry is None:
        return (image_token,) * tokens_per_image
    rows, cols = grid(geometry, width, height)
    row = (image_token,) * cols
    out: list[int] = []
    for r in range(rows):
        out.extend(row)
        out.append(end_token if r == rows - 1 else break_token)
    return tuple(out)

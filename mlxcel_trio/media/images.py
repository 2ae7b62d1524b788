"""Image decoding within bounds.

The header is read first (``Image.open`` parses it without decoding the
pixels), and width, height and pixel count are checked against the caps
before ``load()`` allocates anything; Pillow's own decompression-bomb guard
stays on underneath.  Undecodable data is a 400 naming the problem, with
upstream's leading sentence.
"""

from __future__ import annotations

import io
import warnings

from PIL import Image, UnidentifiedImageError

from .errors import MediaError

MAX_SIDE = 16384            # pixels, either dimension
MAX_PIXELS = 64 * 1024 * 1024  # width * height: 64 Mpx, 256 MiB as RGBA

LOAD_FAILED = "Failed to load image or audio file"  # upstream's sentence


def decode_image(data: bytes, max_side: int = MAX_SIDE,
                 max_pixels: int = MAX_PIXELS) -> Image.Image:
    """`data` decoded to an RGB image (the first frame of an animation)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the caps below decide
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width <= 0 or height <= 0:
                raise MediaError(f"{LOAD_FAILED}: the image has no pixels")
            if width > max_side or height > max_side:
                raise MediaError(f"{LOAD_FAILED}: the image is {width}x{height}; "
                                 f"each side may be at most {max_side} pixels")
            if width * height > max_pixels:
                raise MediaError(f"{LOAD_FAILED}: the image is {width}x{height}; "
                                 f"at most {max_pixels} pixels are decoded")
            image.load()
            return image.convert("RGB")
    except MediaError:
        raise
    except UnidentifiedImageError:
        raise MediaError(f"{LOAD_FAILED}: the data is not an image in a known format") from None
    except Image.DecompressionBombError:  # Pillow's own guard, past twice its pixel limit
        raise MediaError(f"{LOAD_FAILED}: the image is too large to decode "
                         f"(at most {max_pixels} pixels are decoded)") from None
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise MediaError(f"{LOAD_FAILED}: the image data is damaged ({exc})") from None

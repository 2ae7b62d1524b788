"""The interface every media tower speaks, and the plumbing towers share.

A tower is the image or audio encoder beside mlx-lm's text model: built from
the checkpoint's own tensors (`load`), it turns a request's media into
features in the text's width (`encode`), prefills a prompt with them in
place of the placeholder runs (`prefill`), and checks that a job's runs lie
where its media say (`spans_ok`; `span`: how many positions one item takes).
The scheduler speaks to a tower through these alone; towers/registry.py
finds the class for a checkpoint.  `ImageTower` gives an image tower its
prefill and span checks from its `VisionInfo` layout.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Any, Protocol, Sequence

import mlx.core as mx

from ...protocol.records import ImageInput, VisionInfo
from ..lora import split_rows

TEXT_PREFIX = "language_model."
TOWER_PREFIXES = ("vision_tower.", "multi_modal_projector.")
# PIL's resampling codes as preprocessor_config.json spells them (HF's PILImageResampling)
DEFAULT_RESAMPLE = 3  # bicubic


class Tower(Protocol):
    """What the loader and the scheduler ask of a tower."""

    info: Any  # VisionInfo or AudioInfo: what the server lays prompts out with

    @classmethod
    def load(cls, path: Path, config: dict, dtype, budget: tuple[int, int] = (0, 0)) -> "Tower":
        """Build from the checkpoint at `path` in the served float `dtype`
        (`budget`: --image-min-tokens / --image-max-tokens, 0 = the model's)."""

    @staticmethod
    def text_dtype(model):
        """The float type the tower is loaded in: the text model's served one."""

    def encode(self, items: Sequence) -> list[mx.array]: ...

    def prefill(self, model, prompt: Sequence[int], items: Sequence, caches: list,
                step: int) -> int: ...

    def span(self, item) -> int: ...

    def spans_ok(self, prompt: Sequence[int], items: Sequence) -> bool: ...


class ImageTower:
    """An image tower's prefill and span checks, read off its `info` layout
    (a subclass sets `info` and defines `encode`)."""

    info: VisionInfo

    @staticmethod
    def text_dtype(model):
        """The text model's served float type, which the tower takes."""
        return embed_tokens(model).weight.dtype

    def prefill(self, model, prompt: Sequence[int], images: Sequence[ImageInput],
                caches: list, step: int) -> int:
        """Run `prompt` but its last token through `model` into `caches`, each
        image's features in place of its placeholder embeddings (a break or end
        token in its run keeps its own embedding); returns the number of tokens
        the caches now hold.  The last token is left for the batch generator,
        whose first forward samples the first output token.  (A prompt that
        ends on an image therefore sees its last position as the token's own
        embedding: a raw prompt ending on the media marker is the only way to
        get one; rendered chats end on text.)"""
        n = len(prompt) - 1
        feats = self.encode(images)
        ids = mx.array(list(prompt[:n]))
        h = embed_tokens(model)(ids)
        info = self.info
        for im, f in zip(images, feats):
            run = info.layout(im.width, im.height)
            at = [im.start + i for i, t in enumerate(run) if t == info.image_token]
            k = sum(1 for p in at if p < n)
            if k:
                h[mx.array(at[:k])] = f[:k].astype(h.dtype)
        return prefill_embeddings(model, ids, h, caches, step)

    def span(self, image: ImageInput) -> int:
        """How many prompt positions the image's run takes."""
        return len(self.info.layout(image.width, image.height))

    def spans_ok(self, prompt: Sequence[int], images: Sequence[ImageInput]) -> bool:
        """Every image's run lies inside the prompt, in order, exactly as its
        size lays it out (a job built by the server always is)."""
        end = 0
        for im in images:
            run = self.info.layout(im.width, im.height)
            if im.start < end or im.start + len(run) > len(prompt):
                return False
            end = im.start + len(run)
            if tuple(prompt[im.start:end]) != run:
                return False
        return True


# -- shared plumbing ----------------------------------------------------------------

def read_json(path: Path) -> dict:
    """A checkpoint's JSON side file, {} when it is absent."""
    return json.loads(path.read_text()) if path.exists() else {}


def install_tower(path: Path, config: dict, tower, projector, dtype, rename=None) -> None:
    """Load `vision_tower.*` / `multi_modal_projector.*` from the snapshot into
    the modules (`rename`: a family's key fix-up, applied after the prefix is
    dropped), quantized as stored, then cast to the served float `dtype`."""
    weights: dict[str, mx.array] = {}
    for f in sorted(glob.glob(str(path / "model*.safetensors"))):
        weights.update({k: v for k, v in mx.load(f).items() if k.startswith(TOWER_PREFIXES)})
    tower_key, projector_key = TOWER_PREFIXES
    tower_w = {k[len(tower_key):]: v for k, v in weights.items() if k.startswith(tower_key)}
    if rename is not None:
        tower_w = {rename(k): v for k, v in tower_w.items()}
    tower_w = tower.sanitize(tower_w)
    proj_w = {k[len(projector_key):]: v for k, v in weights.items()
              if k.startswith(projector_key)}
    load_parts(((tower, tower_w), (projector, proj_w)), config.get("quantization"), dtype)


def load_parts(parts, quant: dict | None, dtype) -> None:
    """Load each (module, tensors) pair strictly, quantized where the
    stored tensors are, then cast to the served float `dtype` (None: as
    stored)."""
    from mlx import nn

    for module, w in parts:
        if quant and any(k.endswith(".scales") for k in w):
            nn.quantize(module, group_size=quant["group_size"], bits=quant["bits"],
                        class_predicate=lambda p, m, w=w: f"{p}.scales" in w)
        module.load_weights(list(w.items()), strict=True)
        module.eval()
        if dtype is not None:
            module.update(cast(module.parameters(), dtype))
    mx.eval([module.parameters() for module, _ in parts])


def cast(tree: Any, dtype) -> Any:
    if isinstance(tree, dict):
        return {k: cast(v, dtype) for k, v in tree.items()}
    if isinstance(tree, list):
        return [cast(v, dtype) for v in tree]
    if isinstance(tree, mx.array) and mx.issubdtype(tree.dtype, mx.floating):
        return tree.astype(dtype)
    return tree


def embed_tokens(model) -> Any:
    """The text model's token embedding (mlx-lm's `model.model.embed_tokens`)."""
    inner = getattr(model, "model", None)
    layer = getattr(inner, "embed_tokens", None)
    if layer is None:
        raise ValueError("this language model exposes no token embedding to place images in")
    return layer


def prefill_embeddings(model, ids: mx.array, h: mx.array, caches: list, step: int) -> int:
    """Run `ids` with input embeddings `h` through `model` into `caches`,
    `step` tokens a forward; returns how many tokens the caches now hold."""
    n = len(ids)
    for s in range(0, n, max(1, step)):
        e = min(n, s + step)
        model(ids[None, s:e], cache=caches, input_embeddings=h[None, s:e])
        mx.eval([c.state for c in split_rows(caches)[0]])
    return n

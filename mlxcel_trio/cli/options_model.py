"""Where the model comes from, and what is attached to it: the model-source
vocabulary beyond -m, LoRA adapters, control vectors, and the multimodal
projector family.

GGUF-only sources (a URL, a Docker Hub repo, one file inside a HF repo) and
the separate projector file have no MLX meaning and are refused with the
MLX way to say the same thing.  --hf-token authenticates the snapshot
download, --hf-repo resolves like --model, --offline forbids downloads
process-wide.  LoRA adapters (--lora, --lora-scaled) are numbered across
both options in command-line order, as upstream numbers them.
"""

from __future__ import annotations

import re

from typing import Any

from mlxcel_trio.cli import model_ref
from mlxcel_trio.cli.record import Option
from mlxcel_trio.cli.refusals import (
    ALWAYS,
    GGUF_ONLY,
    NO_PROJECTOR,
    Refuser,
    equals,
    not_applicable,
)
from mlxcel_trio.cli.options_server import Directory
from mlxcel_trio.cli.values import CsvList, Int, IntPair, LoraList, Text
from mlxcel_trio.media.limits import DEFAULT_MAX_IMAGES, DEFAULT_MAX_PAYLOAD

MODEL_ISSUE = 2
ADAPTER_ISSUE = 16
MEDIA_ISSUE = 19  # images and audio
POINT_AT_MLX = "point --model at an MLX checkpoint instead"


def _model_url_instead(value: str) -> str:
    repo = model_ref._hub_repo_in_url(value)
    if repo and not value.lower().endswith(".gguf"):
        return f"use --model {repo}"
    return model_ref.INSTEAD


def _hf_repo_why(value: str) -> str:
    return f"a :quant suffix selects a GGUF quantization; {GGUF_ONLY}"


def _hf_repo_instead(value: str) -> str:
    """A GGUF repository (its name says so, as llama.cpp's convention has it)
    holds no MLX weights: point at an MLX conversion of the same model."""
    repo = value.split(":", 1)[0]
    if "gguf" not in repo.lower():
        return f"use --hf-repo {repo} if it holds MLX SafeTensors weights"
    name = re.sub(r"[-_.]?gguf", "", repo.rsplit("/", 1)[-1], flags=re.IGNORECASE)
    return (f"{repo} is a GGUF repository; serve an MLX conversion of the same model, "
            f"e.g. --hf-repo mlx-community/{name}-bf16 (or -4bit, -8bit: the "
            "mlx-community organisation publishes most)")


SOURCE: tuple[Option, ...] = (
    not_applicable(("-mu", "--model-url"), "model_url", "download the model from a URL",
                   value=Text(), metavar="MODEL_URL", env="LLAMA_ARG_MODEL_URL",
                   default_text="unused",
                   why="models are resolved from a directory or a Hugging Face repo "
                   "id, never from a URL", instead=_model_url_instead),
    not_applicable(("-dr", "--docker-repo"), "docker_repo",
                   "download the model from a Docker Hub repository",
                   value=Text(), metavar="[<repo>/]<model>[:quant]",
                   env="LLAMA_ARG_DOCKER_REPO", default_text="unused",
                   why=f"Docker Hub model repositories hold GGUF builds; {GGUF_ONLY}",
                   instead=model_ref.INSTEAD),
    Option(("-hf", "-hfr", "--hf-repo"), "hf_repo",
           "a Hugging Face repo id to serve, resolved exactly like --model (wins over it)",
           value=Text(), metavar="<user>/<model>[:quant]", env="LLAMA_ARG_HF_REPO",
           default_text="unused", status="aliased", owner=MODEL_ISSUE,
           refuse=Refuser(lambda v: ":" not in v, _hf_repo_why, _hf_repo_instead),
           router_only=True),
    not_applicable(("-hff", "--hf-file"), "hf_file", "one file inside the --hf-repo repo",
                   value=Text(), metavar="FILE", env="LLAMA_ARG_HF_FILE",
                   default_text="unused",
                   why="it picks one GGUF file inside a repository, and an MLX "
                   "checkpoint is the whole snapshot",
                   instead="name the repository with --model owner/name", router_only=True),
    Option(("-hft", "--hf-token"), "hf_token",
           "Hugging Face access token for downloading the model",
           value=Text(allow_empty=True), metavar="TOKEN", env="HF_TOKEN",
           default_text="value from HF_TOKEN environment variable", secret=True,
           owner=3),
    Option(("--model-store-root",), "model_store_root",
           "mlxcel-trio: the model store, a Hugging Face cache layout that -m owner/name, "
           "mlxcel download / list / rm and router mode read and fill",
           value=Text(), metavar="PATH", default_text="the Hugging Face cache",
           env="MLXCEL_MODELS_DIR", upstream=False, owner=18),
    Option(("--offline",), "offline",
           "never download: resolve models from the local Hugging Face cache only",
           kind="flag", default=False, env="LLAMA_ARG_OFFLINE", owner=MODEL_ISSUE),
    Option(("--tags",), "tags", "informational model tags, comma-separated (shown by /v1/models)",
           value=CsvList(), metavar="STRING", default=(), env="LLAMA_ARG_TAGS",
           section="server", owner=MODEL_ISSUE),
)

# A vector accepted but not applied would change what a deployment believes it
# serves; any configured vector (a zero scale included) is refused whole.
NO_STEERING = ("mlxcel-trio has no control-vector path: nothing adds steering vectors "
               "to the residual stream, and a vector accepted unapplied would silently "
               "change what is served")
STEER_LOGITS = ("omit it; the nearest feature is logit-level steering "
                "(-l/--logit-bias, or the per-request logit_bias field)")

ADAPTERS: tuple[Option, ...] = (
    Option(("--lora",), "lora",
           "LoRA adapter directories (mlx-lm or PEFT layout) to load at scale 1.0; "
           "comma-separated, repeatable",
           value=LoraList(), metavar="FNAME", default=(), repeat=True, owner=ADAPTER_ISSUE),
    Option(("--lora-scaled",), "lora_scaled",
           "LoRA adapters with a scale each (FNAME:SCALE,...); repeatable",
           value=LoraList(scaled=True), metavar="FNAME:SCALE,...", default=(), repeat=True,
           owner=ADAPTER_ISSUE),
    Option(("--lora-init-without-apply",), "lora_init_without_apply",
           "load the LoRA adapters at scale 0 (raise them later with POST /lora-adapters)",
           kind="flag", default=False, default_text="disabled", owner=ADAPTER_ISSUE,
           section="server"),
    not_applicable(("--control-vector",), "control_vector",
                   "add control vectors (comma-separated paths)",
                   value=Text(), metavar="FNAME",
                   why=NO_STEERING, instead=STEER_LOGITS),
    not_applicable(("--control-vector-scaled",), "control_vector_scaled",
                   "add control vectors with a scale each (FNAME:SCALE,...)",
                   value=Text(), metavar="FNAME:SCALE,...",
                   why=NO_STEERING, instead=STEER_LOGITS),
    not_applicable(("--control-vector-layer-range",), "control_vector_layer_range",
                   "first and last layer the control vectors apply to",
                   value=IntPair(), metavar="START END", nargs=2,
                   why="", inert=ALWAYS,
                   accepts="any range (without a control vector it configures nothing)"),
)


def _projector(spellings: tuple[str, ...], dest: str, help: str, **kw: Any) -> Option:
    kw.setdefault("why", NO_PROJECTOR)
    kw.setdefault("section", "server")
    return not_applicable(spellings, dest, help, **kw)


MULTIMODAL: tuple[Option, ...] = (
    _projector(("-mm", "--mmproj"), "mmproj", "a multimodal projector file",
               value=Text(), metavar="FILE", env="LLAMA_ARG_MMPROJ",
               instead=POINT_AT_MLX),
    _projector(("-mmu", "--mmproj-url"), "mmproj_url", "download a projector from a URL",
               value=Text(), metavar="URL", env="LLAMA_ARG_MMPROJ_URL",
               instead=POINT_AT_MLX),
    # the image tower ships inside the MLX checkpoint: the default admits
    # images, --no-mmproj refuses every image part (server/request/media_input.py)
    Option(("--mmproj-auto",), "mmproj_auto",
           "accept image input when the checkpoint has an image tower "
           "(--no-mmproj refuses every image part)",
           kind="bool", negations=("--no-mmproj", "--no-mmproj-auto"), default=True,
           env="LLAMA_ARG_MMPROJ_AUTO", status="by_design", hidden=True, section="server"),
    _projector(("--mmproj-offload",), "mmproj_offload", "run the projector on the GPU",
               kind="bool", negations=("--no-mmproj-offload",), default=True,
               env="LLAMA_ARG_MMPROJ_OFFLOAD", inert=equals(True),
               accepts="--mmproj-offload"),
    _projector(("-mmdev", "--mmproj-device"), "mmproj_device",
               "the device for the projector", value=Text(), metavar="DEVICE",
               env="MTMD_BACKEND_DEVICE"),
    # a dynamic-resolution family's token budget (engine/vision.py): a
    # positive value becomes upstream's pixel bound; a checkpoint with a
    # fixed geometry refuses a budget at startup
    Option(("--image-min-tokens",), "image_min_tokens",
           "fewest tokens one image may take (dynamic-resolution checkpoints)",
           value=Int(), metavar="N", default=-1, env="LLAMA_ARG_IMAGE_MIN_TOKENS",
           default_text="read from model", status="by_design", hidden=True, section="server",
           owner=MEDIA_ISSUE),
    Option(("--image-max-tokens",), "image_max_tokens",
           "most tokens one image may take (dynamic-resolution checkpoints)",
           value=Int(), metavar="N", default=-1, env="LLAMA_ARG_IMAGE_MAX_TOKENS",
           default_text="read from model", status="by_design", hidden=True, section="server",
           owner=MEDIA_ISSUE),
    _projector(("--mtmd-batch-max-tokens",), "mtmd_batch_max_tokens",
               "most image tokens encoded per batch", value=Int(), metavar="N",
               default=1024, env="LLAMA_ARG_MTMD_BATCH_MAX_TOKENS",
               inert=equals(1024), accepts="1024"),
    # media inputs (mlxcel_trio/media): visible, under their own heading
    Option(("--media-path",), "media_path",
           "directory for local media files: a file:// URL is read relative to it first "
           "(file://cat.png and a bare cat.png read PATH/cat.png), and an absolute "
           "file:///... URL only when it names a file inside it; a path leaving PATH "
           "(.., a symlink out) is refused",
           value=Directory(), metavar="PATH", default_text="disabled", section="multimodal",
           status="by_design", owner=MEDIA_ISSUE),
    Option(("--max-image-payload-size",), "max_image_payload_size",
           "most bytes one media payload (a fetched URL, a file:// file, an inline base64 "
           "item) may hold",
           value=Int(lo=1), metavar="BYTES", default=DEFAULT_MAX_PAYLOAD,
           default_text=f"{DEFAULT_MAX_PAYLOAD} (20 MiB)", section="multimodal",
           upstream=False, owner=MEDIA_ISSUE),
    Option(("--max-images",), "max_images",
           "most media items one request may carry; with --max-image-payload-size it "
           "also sizes the JSON body limit of the chat, responses and messages routes",
           value=Int(lo=1, hi=4096), metavar="N", default=DEFAULT_MAX_IMAGES,
           section="multimodal", upstream=False, owner=MEDIA_ISSUE),
)

"""Classify and resolve the `-m/--model` reference before anything heavy loads.

mlxcel-trio serves MLX SafeTensors checkpoint directories.  A llama-server
command line often names a GGUF file, a split GGUF shard or a URL instead;
those are refused here with one line saying why and what to use, before mlx,
mlx-lm or even huggingface_hub is imported, so the refusal is instant.

`refusal` is pure (string in, reason out) and is the option table's refuse
hook for `--model`.  `resolve` touches the filesystem and, for an
``owner/name`` repo id that is not a local path, the Hugging Face cache or
network; huggingface_hub is imported only on that path.  It honours
HF_HUB_OFFLINE and HF_TOKEN the way huggingface_hub itself does.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import attrs

OPTION = "--model"
INSTEAD = (
    "use an MLX checkpoint directory containing config.json and *.safetensors, "
    "or a Hugging Face repo id such as mlx-community/Qwen3-0.6B-bf16"
)
_NOT_GGUF = "mlxcel-trio serves MLX SafeTensors checkpoint directories, not GGUF"

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_SPLIT_SHARD = re.compile(r"-[0-9]{5}-of-[0-9]{5}\.gguf", re.IGNORECASE)
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+")
_HF_HOSTS = frozenset({"huggingface.co", "www.huggingface.co", "hf.co"})



class ModelRefError(Exception):
    """A model reference that cannot be served; str() is the one-line reason."""


@attrs.frozen
class ResolvedModel:
    ref: str      # what the operator passed
    path: str     # the local checkpoint directory to load
    source: str   # "local" or "hub"


def _hub_repo_in_url(value: str) -> str | None:
    """owner/name when a URL points into the Hugging Face Hub."""
    parts = urlsplit(value)
    if parts.scheme == "hf":
        path = f"{parts.netloc}{parts.path}"
    elif parts.hostname in _HF_HOSTS:
        path = parts.path
    else:
        return None
    segments = [s for s in path.split("/") if s]
    if len(segments) >= 2 and _REPO_ID.fullmatch("/".join(segments[:2])):
        return "/".join(segments[:2])
    return None


def refusal(value: str) -> str | None:
    """Why `value` can never be a model reference here, or None if it may be."""
    if _URL.match(value):
        repo = _hub_repo_in_url(value)
        if repo and not value.lower().endswith(".gguf"):
            return f"URLs are not accepted as model references; use --model {repo}"
        return f"URLs are not accepted as model references ({_NOT_GGUF}); {INSTEAD}"
    if _SPLIT_SHARD.search(value):
        return f"this is a llama.cpp split GGUF shard; {_NOT_GGUF}; {INSTEAD}"
    if value.lower().endswith(".gguf"):
        return f"this is a GGUF file; {_NOT_GGUF}; {INSTEAD}"
    return None


def looks_like_repo_id(value: str) -> bool:
    return bool(_REPO_ID.fullmatch(value))


def _check_checkpoint_dir(path: Path, what: str) -> None:
    if not (path / "config.json").is_file():
        raise ModelRefError(f"{what} has no config.json, so it is not an MLX checkpoint; {INSTEAD}")
    if not any(path.glob("*.safetensors")):
        raise ModelRefError(f"{what} has no *.safetensors weights; {INSTEAD}")


def resolve(value: str, token: str | None = None) -> ResolvedModel:
    """Turn a `--model` value into a local checkpoint directory, or refuse.
    `token` (from --hf-token) authenticates a Hub download; without it
    huggingface_hub falls back to HF_TOKEN and its stored login."""
    reason = refusal(value)
    if reason is not None:
        raise ModelRefError(reason)
    path = Path(value).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelRefError(f"not a directory; {INSTEAD}")
        _check_checkpoint_dir(path, "the directory")
        return ResolvedModel(ref=value, path=str(path.resolve()), source="local")
    if looks_like_repo_id(value) and not value.startswith("."):
        local = _download(value, token)
        _check_checkpoint_dir(Path(local), f"the Hugging Face repo {value}")
        return ResolvedModel(ref=value, path=local, source="hub")
    raise ModelRefError(
        f"no such directory, and not a Hugging Face repo id (owner/name); {INSTEAD}"
    )


def _download(repo_id: str, token: str | None = None) -> str:
    """Fetch (or find in the cache) a Hub snapshot, with a progress bar on
    stderr; failures become one line."""
    from mlxcel_trio import downloads

    try:
        return str(downloads.fetch(repo_id, token=token,
                                   on_progress=downloads.TerminalBar(repo_id)))
    except downloads.DownloadError as exc:
        raise ModelRefError(str(exc)) from None

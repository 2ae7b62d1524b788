"""Load an encoder checkpoint: `load(path) -> (model, EncoderInfo)`.

Reads config.json (`model_type` bert / roberta / xlm-roberta and
`architectures`), the safetensors weights (one file or an index of
shards), and the sentence-transformers files when present (sentence.py).
The class comes from the architecture name: `...ForSequenceClassification`
builds the cross-encoder head, anything else the plain body (an MLM head in
the file is dropped).  Weights load strictly: a missing or unexpected
tensor is an error naming it, never a silently random layer.

The default pooling, in order:
  1. a classifier (`...ForSequenceClassification`) ranks: `rank`;
  2. 1_Pooling/config.json via modules.json: mean, cls or last (sentence.py);
  3. otherwise `mean`, what sentence-transformers itself builds around a
     plain Hugging Face checkpoint (llama.cpp's converter would leave the
     pooling unset, and llama-server would then need --pooling).
A 1_Pooling mode llama-server cannot name (max ...) also falls back to 3,
with a note in `EncoderInfo.notes`.

Precision: on a CPU every floating weight is computed in float32 (bf16 /
f16 checkpoints are upcast once at load); elsewhere the stored dtype is
kept unless `dtype` says otherwise.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import attrs
import mlx.core as mx
from mlx import nn

from . import sentence
from .bert import BertForSequenceClassification, BertModel, ModelArgs
from .xlm_roberta import XLMRobertaForSequenceClassification, XLMRobertaModel

log = logging.getLogger("mlxcel.engine")

# model_type -> (body class, classifier class)
FAMILIES: dict[str, tuple[type[BertModel], type[BertForSequenceClassification]]] = {
    "bert": (BertModel, BertForSequenceClassification),
    "roberta": (XLMRobertaModel, XLMRobertaForSequenceClassification),
    "xlm-roberta": (XLMRobertaModel, XLMRobertaForSequenceClassification),
}
POOLINGS = ("none", "mean", "cls", "last", "rank")


class EncoderLoadError(ValueError):
    """The checkpoint is not an encoder this module can build; one line why."""


@attrs.frozen
class EncoderInfo:
    """What the rest of the server needs to know about a loaded encoder."""
    architecture: str            # the class built: "BertModel", "XLMRobertaForSequenceClassification" ...
    model_type: str              # config.json's: "bert", "roberta", "xlm-roberta"
    hidden_size: int
    max_positions: int           # usable tokens per input (RoBERTa: less the padding offset)
    vocab_size: int
    pad_token_id: int
    default_pooling: str         # one of POOLINGS
    pooling_source: str          # "1_Pooling/config.json", "classifier head" or "architecture default"
    num_labels: int | None       # logits per input for a classifier, None for an embedder
    labels: tuple[str, ...]      # id2label names, in id order ("" when unnamed)
    dense_layers: int            # sentence-transformers Dense layers applied by `project`
    embedding_size: int          # length of a pooled vector after `project`
    normalize: bool              # modules.json ends in a Normalize module
    dtype: str                   # the dtype the weights are computed in
    notes: tuple[str, ...] = ()  # fallbacks worth a log line

    @property
    def is_classifier(self) -> bool:
        return self.num_labels is not None


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EncoderLoadError(f"cannot read {path}: {exc}") from None


def _weight_files(root: Path) -> list[Path]:
    index = root / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(_read_json(index)["weight_map"].values()))
        return [root / n for n in names]
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise EncoderLoadError(f"{root}: no *.safetensors weights (pytorch_model.bin "
                               "checkpoints need converting to safetensors first)")
    return files


def _target_dtype(dtype) -> mx.Dtype | None:
    if dtype is not None:
        return dtype
    return mx.float32 if mx.default_device().type == mx.cpu else None


def _read_weights(root: Path, dtype) -> dict[str, mx.array]:
    weights: dict[str, mx.array] = {}
    for f in _weight_files(root):
        weights.update(mx.load(str(f)))
    if dtype is not None:
        weights = {k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v
                   for k, v in weights.items()}
    return weights


def pick_class(config: dict) -> type[nn.Module]:
    model_type = str(config.get("model_type"))
    if model_type not in FAMILIES:
        raise EncoderLoadError(f"unsupported encoder model_type {model_type!r}; "
                               f"supported: {', '.join(FAMILIES)}")
    body, classifier = FAMILIES[model_type]
    architectures = config.get("architectures") or ()
    if isinstance(architectures, str):
        architectures = (architectures,)
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        return classifier
    return body


def _pooling(classifier: bool,
             pipeline: sentence.Pipeline | None) -> tuple[str, str, tuple[str, ...]]:
    if classifier:
        return "rank", "classifier head", ()
    if pipeline is not None and pipeline.pooling_dir is not None:
        name, stated = sentence.pooling_mode(pipeline.pooling_dir)
        if name is not None:
            return name, "1_Pooling/config.json", ()
        note = (f"{pipeline.pooling_dir.name}/config.json asks for pooling {stated!r}, which "
                "llama-server cannot name; defaulting to 'mean'")
        return "mean", "architecture default", (note,)
    return "mean", "architecture default", ()


def _build(body_root: Path, config: dict, target) -> tuple[nn.Module, ModelArgs]:
    """The model class for `config`, with the checkpoint's weights loaded strictly."""
    cls = pick_class(config)
    try:
        args = ModelArgs.from_dict(config)
    except (TypeError, ValueError) as exc:
        raise EncoderLoadError(f"{body_root / 'config.json'}: {exc}") from None
    weights = cls.sanitize(_read_weights(body_root, target))
    if issubclass(cls, BertForSequenceClassification):
        model = cls(args)
    else:
        model = cls(args, pooler=any(k.startswith("pooler.") for k in weights))
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise EncoderLoadError(f"{body_root}: weights do not match {cls.__name__}: {exc}") from None
    return model, args


def load(path: str | Path, dtype: mx.Dtype | None = None) -> tuple[nn.Module, EncoderInfo]:
    """Build the encoder at `path` with its weights; see the module docstring."""
    root = Path(path)
    pipeline = sentence.read_pipeline(root)
    body_root = pipeline.transformer_dir if pipeline else root
    config = _read_json(body_root / "config.json")
    target = _target_dtype(dtype)
    model, args = _build(body_root, config, target)
    classifier = isinstance(model, BertForSequenceClassification)
    body = model.body if classifier else model
    try:
        body.st_dense = [sentence.load_dense(d, target or mx.float32)
                         for d in (pipeline.dense_dirs if pipeline else ())]
    except (OSError, ValueError, KeyError) as exc:
        raise EncoderLoadError(f"{root}: sentence-transformers Dense: {exc}") from None
    mx.eval(model.parameters())

    pooling, source, notes = _pooling(classifier, pipeline)
    for note in notes:
        log.warning("%s", note)
    dense = body.st_dense
    id2label = {int(k): str(v) for k, v in (args.id2label or {}).items()}
    info = EncoderInfo(
        architecture=type(model).__name__, model_type=str(config["model_type"]),
        hidden_size=args.hidden_size, max_positions=body.max_length,
        vocab_size=args.vocab_size, pad_token_id=args.pad_token_id,
        default_pooling=pooling, pooling_source=source,
        num_labels=args.labels if classifier else None,
        labels=tuple(id2label.get(i, "") for i in range(args.labels)) if classifier else (),
        dense_layers=len(dense),
        embedding_size=dense[-1].linear.weight.shape[0] if dense else args.hidden_size,
        normalize=bool(pipeline and pipeline.normalize),
        dtype=str(body.embeddings.word_embeddings.weight.dtype).removeprefix("mlx.core."),
        notes=notes,
    )
    return model, info

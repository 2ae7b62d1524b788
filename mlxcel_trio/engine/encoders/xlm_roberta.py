"""RoBERTa and XLM-RoBERTa encoders (bge-m3, multilingual-e5 ...) and the
...ForSequenceClassification cross-encoder head (bge-reranker ...).

The body is BERT's (bert.py) with two differences, both in the embeddings:
positions count from padding_idx + 1 and skip padding tokens, as Hugging
Face's `create_position_ids_from_input_ids` (so the usable length is
max_position_embeddings - padding_idx - 1, 512 for the usual 514), and the
token-type vocabulary has a single entry.  The classification head reads
the <s> token through its own dense + tanh and an out_proj; RoBERTa
classifiers carry no pooler.
"""

from __future__ import annotations

import mlx.core as mx
from mlx import nn

from .bert import BertEmbeddings, BertForSequenceClassification, BertModel, ModelArgs


def position_offset(args: ModelArgs) -> int:
    """Positions below this index are never used (padding_idx and before)."""
    return args.pad_token_id + 1


class RobertaEmbeddings(BertEmbeddings):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.padding_idx = args.pad_token_id

    def max_length(self, args: ModelArgs) -> int:
        return args.max_position_embeddings - position_offset(args)

    def position_ids(self, input_ids: mx.array, attention_mask: mx.array) -> mx.array:
        """padding_idx + 1, + 2 ... over real tokens; padding_idx on padding.

        HF tests `input_ids != padding_idx`; the attention mask is folded in
        too, so a batch padded with some other id keeps padded slots in range.
        """
        real = ((input_ids != self.padding_idx) & attention_mask.astype(mx.bool_)).astype(mx.int32)
        return mx.cumsum(real, axis=1) * real + self.padding_idx


class XLMRobertaModel(BertModel):
    """The RoBERTa / XLM-RoBERTa body: `model(ids, mask) -> [B, L, H]`."""

    embeddings_class = RobertaEmbeddings

    @staticmethod
    def sanitize(weights, prefixes=("roberta.", "model.")):
        return BertModel.sanitize(weights, prefixes)


class RobertaClassificationHead(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.dense = nn.Linear(args.hidden_size, args.hidden_size)
        self.out_proj = nn.Linear(args.hidden_size, args.labels)

    def __call__(self, hidden: mx.array) -> mx.array:
        return self.out_proj(mx.tanh(self.dense(hidden[:, 0])))


class XLMRobertaForSequenceClassification(BertForSequenceClassification):
    """Cross-encoder: logits = out_proj(tanh(classifier.dense(h[:, <s>])))."""

    body_class = XLMRobertaModel
    prefix = "roberta."

    def __init__(self, args: ModelArgs):
        nn.Module.__init__(self)
        self.roberta = XLMRobertaModel(args, pooler=False)
        self.classifier = RobertaClassificationHead(args)

    @property
    def body(self) -> XLMRobertaModel:
        return self.roberta

    def head(self, hidden: mx.array) -> mx.array:
        return self.classifier(hidden)

    @classmethod
    def sanitize(cls, weights):
        """As BERT's, less a pooler some checkpoints carry and the head never reads."""
        out = super().sanitize(weights)
        return {k: v for k, v in out.items() if not k.startswith("roberta.pooler.")}


# The same module serves model_type "roberta" (RobertaModel, ...ForSequenceClassification).
RobertaModel = XLMRobertaModel
RobertaForSequenceClassification = XLMRobertaForSequenceClassification

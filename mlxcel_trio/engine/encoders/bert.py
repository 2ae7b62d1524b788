"""BERT encoders (bge, e5, all-MiniLM ...) and the BertForSequenceClassification
cross-encoder head, written with MLX in mlx-lm's shape.

The body is post-LN: every sublayer adds its residual and then normalizes.
Attention is bidirectional; the only mask is the padding mask, so a batch
padded on the right gives each row exactly what that row alone would get
(padded keys weigh exp(-huge) = 0, and the padded query rows are computed
and ignored).  Module and attribute names follow Hugging Face's
`modeling_bert` one for one (`attention.self.query`, `output.LayerNorm`),
so a checkpoint's keys load without a rename table; `sanitize` only strips
the prefixes wrappers add (`bert.`, `model.`) and renames the TF-era
`gamma`/`beta` LayerNorm keys.

Every model here answers `model(input_ids, attention_mask, token_type_ids=None)`
with the last hidden states [B, L, H], and `project(pooled)` applies the
sentence-transformers Dense layers (2_Dense ...) the loader attached, in
order (identity when there are none).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import mlx.core as mx
from mlx import nn

# A large negative added to the scores of padded keys: finite, so a row
# whose keys are all padding (a padded query row) stays NaN-free.
_MASKED = -1e30

ACTIVATIONS = {
    "gelu": nn.gelu,                       # exact (erf), HF's "gelu"
    "gelu_new": nn.gelu_approx,            # the tanh approximation, under three names
    "gelu_pytorch_tanh": nn.gelu_approx,
    "gelu_fast": nn.gelu_approx,
    "quick_gelu": nn.gelu_fast_approx,     # x * sigmoid(1.702 x)
    "relu": nn.relu,
    "silu": nn.silu,
    "swish": nn.silu,
}


@dataclass
class ModelArgs:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    position_embedding_type: str = "absolute"
    id2label: dict = field(default_factory=dict)
    num_labels: int | None = None

    @classmethod
    def from_dict(cls, params: dict) -> ModelArgs:
        """Unknown keys (dropout rates, transformers_version ...) are dropped."""
        known = inspect.signature(cls).parameters
        return cls(**{k: v for k, v in params.items() if k in known})

    def __post_init__(self):
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"unsupported hidden_act {self.hidden_act!r}; "
                             f"supported: {', '.join(sorted(ACTIVATIONS))}")
        if self.position_embedding_type != "absolute":
            raise ValueError(f"unsupported position_embedding_type "
                             f"{self.position_embedding_type!r}; only 'absolute'")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size is not a multiple of num_attention_heads")

    @property
    def labels(self) -> int:
        """HF's num_labels: the id2label count, else the explicit value, else 2."""
        if self.id2label:
            return len(self.id2label)
        return self.num_labels if self.num_labels is not None else 2


def padding_bias(attention_mask: mx.array, dtype=mx.float32) -> mx.array:
    """[B, L] 1/0 mask -> additive [B, 1, 1, L] bias on the attention scores."""
    keep = attention_mask.astype(mx.bool_)[:, None, None, :]
    return mx.where(keep, mx.array(0.0, dtype), mx.array(_MASKED, dtype))


class BertEmbeddings(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.word_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.position_embeddings = nn.Embedding(args.max_position_embeddings, args.hidden_size)
        self.token_type_embeddings = nn.Embedding(args.type_vocab_size, args.hidden_size)
        self.LayerNorm = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def max_length(self, args: ModelArgs) -> int:
        """The longest input the position table covers."""
        return args.max_position_embeddings

    def position_ids(self, input_ids: mx.array, attention_mask: mx.array) -> mx.array:
        """BERT: 0, 1, 2 ... from the left edge (right padding keeps them)."""
        return mx.broadcast_to(mx.arange(input_ids.shape[1]), input_ids.shape)

    def __call__(self, input_ids, attention_mask, token_type_ids):
        pos = self.position_ids(input_ids, attention_mask)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(pos)
             + self.token_type_embeddings(token_type_ids))
        return self.LayerNorm(x)


class BertSelfAttention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        h = args.hidden_size
        self.n_heads = args.num_attention_heads
        self.scale = (h // self.n_heads) ** -0.5
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)

    def __call__(self, x: mx.array, bias: mx.array) -> mx.array:
        B, L, H = x.shape

        def heads(t):
            return t.reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        scores = (q * self.scale) @ k.transpose(0, 1, 3, 2) + bias
        out = mx.softmax(scores, axis=-1, precise=True) @ v
        return out.transpose(0, 2, 1, 3).reshape(B, L, H)


class BertSelfOutput(nn.Module):
    """A dense layer, then LayerNorm over it plus the residual (post-LN)."""

    def __init__(self, d_in: int, args: ModelArgs):
        super().__init__()
        self.dense = nn.Linear(d_in, args.hidden_size)
        self.LayerNorm = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def __call__(self, x: mx.array, residual: mx.array) -> mx.array:
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.self = BertSelfAttention(args)
        self.output = BertSelfOutput(args.hidden_size, args)

    def __call__(self, x, bias):
        return self.output(self.self(x, bias), x)


class BertIntermediate(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.dense = nn.Linear(args.hidden_size, args.intermediate_size)
        self.act = ACTIVATIONS[args.hidden_act]

    def __call__(self, x):
        return self.act(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention = BertAttention(args)
        self.intermediate = BertIntermediate(args)
        self.output = BertSelfOutput(args.intermediate_size, args)

    def __call__(self, x, bias):
        x = self.attention(x, bias)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.layer = [BertLayer(args) for _ in range(args.num_hidden_layers)]

    def __call__(self, x, bias):
        for layer in self.layer:
            x = layer(x, bias)
        return x


class BertPooler(nn.Module):
    """dense + tanh on the first token: BERT's pooler and the classifier's input."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.dense = nn.Linear(args.hidden_size, args.hidden_size)

    def __call__(self, hidden: mx.array) -> mx.array:
        return mx.tanh(self.dense(hidden[:, 0]))


class BertModel(nn.Module):
    """The encoder body: `model(ids, mask) -> [B, L, H]`."""

    embeddings_class = BertEmbeddings

    def __init__(self, args: ModelArgs, pooler: bool = False):
        super().__init__()
        self.args = args
        self.embeddings = self.embeddings_class(args)
        self.encoder = BertEncoder(args)
        if pooler:
            self.pooler = BertPooler(args)
        self.st_dense = []   # sentence-transformers Dense layers, set by the loader
        self.max_length = self.embeddings.max_length(args)

    def __call__(self, input_ids: mx.array, attention_mask: mx.array | None = None,
                 token_type_ids: mx.array | None = None) -> mx.array:
        if input_ids.shape[1] > self.max_length:
            # An embedding gather past the table would read garbage, not fail.
            raise ValueError(f"input of {input_ids.shape[1]} tokens exceeds the "
                             f"{self.max_length} positions this encoder has")
        if attention_mask is None:
            attention_mask = mx.ones(input_ids.shape, dtype=mx.int32)
        if token_type_ids is None or self.args.type_vocab_size == 1:
            # One token type (RoBERTa): a pair's segment ids have nothing to select.
            token_type_ids = mx.zeros(input_ids.shape, dtype=mx.int32)
        x = self.embeddings(input_ids, attention_mask, token_type_ids)
        return self.encoder(x, padding_bias(attention_mask, x.dtype))

    def project(self, pooled: mx.array) -> mx.array:
        """Apply the sentence-transformers Dense layers to pooled vectors [B, H]."""
        for layer in self.st_dense:
            pooled = layer(pooled)
        return pooled

    @staticmethod
    def sanitize(weights: dict[str, mx.array], prefixes=("bert.", "model.")) -> dict[str, mx.array]:
        """Strip a wrapper prefix, rename gamma/beta, drop buffers and MLM heads."""
        out = {}
        for key, value in weights.items():
            for p in prefixes:
                if key.startswith(p):
                    key = key[len(p):]
                    break
            if key.endswith("position_ids") or key.startswith(("cls.", "lm_head.")):
                continue
            if ".LayerNorm." in key or key.startswith("LayerNorm."):
                key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace(
                    "LayerNorm.beta", "LayerNorm.bias")
            out[key] = value
        return out


class BertForSequenceClassification(nn.Module):
    """Cross-encoder: logits = classifier(tanh(pooler.dense(h[:, 0])))."""

    body_class = BertModel
    prefix = "bert."

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.bert = self.body_class(args, pooler=True)
        self.classifier = nn.Linear(args.hidden_size, args.labels)

    @property
    def body(self) -> BertModel:
        return self.bert

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None) -> mx.array:
        return self.body(input_ids, attention_mask, token_type_ids)

    def classify(self, input_ids: mx.array, attention_mask: mx.array | None = None,
                 token_type_ids: mx.array | None = None) -> mx.array:
        """[B, L] -> raw logits [B, num_labels] (a reranker's score is column 0)."""
        hidden = self(input_ids, attention_mask, token_type_ids)
        return self.head(hidden)

    def head(self, hidden: mx.array) -> mx.array:
        return self.classifier(self.bert.pooler(hidden))

    def project(self, pooled: mx.array) -> mx.array:
        return self.body.project(pooled)

    @classmethod
    def sanitize(cls, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Body keys go under `bert.` whatever prefix the file used; head keys stay."""
        body = {k: v for k, v in weights.items() if not k.startswith("classifier.")}
        out = {cls.prefix + k: v for k, v in cls.body_class.sanitize(body).items()}
        out.update({k: v for k, v in weights.items() if k.startswith("classifier.")})
        return out

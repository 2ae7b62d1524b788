"""Embedding and rerank jobs on the MLX thread: an encoder model, a queue of
`EmbedJob`s, and one batched forward per `step`.

Theory of operation.  `submit` checks a job (ids in the vocabulary, a
length the physical batch and the position table allow) and queues it, or
answers `Failed` at once.  `step` takes the oldest queued jobs while their
right-padded rectangle stays within `chunk_tokens` (always at least one
job), runs ONE forward over them with an attention mask, pools each row
over its real tokens, applies the sentence-transformers Dense head and
normalizes, and appends one `Embedded` per job.  The engine loop calls
`step` between scheduler steps, so a chat model's decode waits for at most
one chunk.  `cancel` drops a queued job; a job in the running chunk has
already been computed when the cancel is read (its result is then dropped
by the bridge).  Each row of a batch equals its single-input result
(right padding, masked attention; the encoders guarantee it).

Normalization is upstream's `common_embd_normalize` arithmetic, in double
precision: -1 none, 0 the max-abs rescale into the int16 range, 2
euclidean, any other value p-norm (1 = taxicab); a zero vector stays zero.
Nothing here imports trio.
"""

from __future__ import annotations

import collections
import logging
import math

import numpy as np

from ..protocol.records import EmbedderInfo, EmbedJob, Embedded, Failed

log = logging.getLogger("mlxcel.engine")


def normalize(vec: np.ndarray, kind: int) -> np.ndarray:
    """One vector normalized as upstream's common_embd_normalize does."""
    v = np.asarray(vec, np.float64)
    if kind == -1:
        total = 1.0
    elif kind == 0:
        total = float(np.max(np.abs(v), initial=0.0)) / 32760.0
    elif kind == 2:
        total = math.sqrt(float(np.sum(v * v)))
    else:
        with np.errstate(over="ignore", divide="ignore"):
            total = float(np.sum(np.abs(v) ** float(kind))) ** (1.0 / kind)
    norm = np.float32(1.0 / total) if total > 0.0 else np.float32(0.0)
    return np.asarray(vec, np.float32) * norm


def pool(hidden, mask, kind: str):
    """Pooled rows [B, H] of right-padded hidden states [B, L, H] (MLX),
    over each row's real tokens (`mask` [B, L], 1 = real)."""
    import mlx.core as mx

    if kind == "cls":
        return hidden[:, 0, :]
    lengths = mask.sum(axis=1)
    if kind == "last":
        idx = (lengths - 1).astype(mx.int32)
        return mx.take_along_axis(hidden, idx[:, None, None], axis=1)[:, 0, :]
    if kind == "mean":
        m = mask.astype(hidden.dtype)[:, :, None]
        return (hidden * m).sum(axis=1) / lengths.astype(hidden.dtype)[:, None]
    raise ValueError(f"no pooling kernel {kind!r}")


class Embedder:
    """An encoder model and its queue (engine thread only)."""

    def __init__(self, model, info, path: str, *, n_batch: int, chunk_tokens: int,
                 pooling: str | None = None) -> None:
        self.model = model
        self.info = info            # engine/encoders' EncoderInfo
        self.n_batch = n_batch      # the longest input accepted (upstream: -ub)
        self.chunk_tokens = max(1, chunk_tokens)
        self.pooling = pooling or info.default_pooling
        self.public = EmbedderInfo(
            path=path, architecture=info.architecture, pooling=self.pooling,
            n_embd=int(info.embedding_size), n_ctx_train=int(info.max_positions),
            n_vocab=int(info.vocab_size), is_classifier=bool(info.is_classifier),
            rerank_template=getattr(model, "rerank_template", None))
        self._queue: collections.deque[EmbedJob] = collections.deque()
        self.n_inputs = 0           # inputs computed, for the load summary / stats
        self.n_tokens = 0

    @classmethod
    def load(cls, path: str, *, n_batch: int, chunk_tokens: int,
             pooling: str | None = None) -> "Embedder":
        if is_encoder(path):
            from .encoders import load

            model, info = load(path)
        else:  # a causal checkpoint: mlx-lm's final hidden states
            from .encoders.decoder import is_qwen3_reranker, load_decoder, load_decoder_reranker

            if is_qwen3_reranker(path) and pooling in (None, "rank"):
                model, info = load_decoder_reranker(path)
            else:
                model, info = load_decoder(path)
        for note in info.notes:
            log.info("%s", note)
        emb = cls(model, info, str(path), n_batch=n_batch, chunk_tokens=chunk_tokens,
                  pooling=pooling)
        if emb.pooling == "rank" and not info.is_classifier:
            raise ValueError(f"{path}: pooling rank needs a classifier (a ...For"
                             "SequenceClassification checkpoint)")
        return emb

    @property
    def pending(self) -> bool:
        return bool(self._queue)

    def submit(self, job: EmbedJob, out: list) -> None:
        n = len(job.tokens)
        vocab = self.info.vocab_size
        if n == 0:
            out.append(Failed.coded(job.id, "empty_input"))
        elif any(t < 0 or t >= vocab for t in job.tokens):
            out.append(Failed.coded(job.id, "invalid_tokens"))
        elif n > self.n_batch:
            # upstream's refusal of an input the physical batch cannot hold
            out.append(Failed.coded(job.id, "exceeds_batch",
                                    {"n_tokens": n, "n_batch": self.n_batch}))
        elif n > self.info.max_positions:
            out.append(Failed.coded(job.id, "embed_exceeds_context", n_prompt_tokens=n,
                                    n_ctx=self.info.max_positions))
        elif job.pooling == "rank" and not self.info.is_classifier:
            out.append(Failed.coded(job.id, "no_reranking"))
        else:
            self._queue.append(job)

    def cancel(self, job_id: int) -> bool:
        for job in self._queue:
            if job.id == job_id:
                self._queue.remove(job)
                return True
        return False

    def fail_all(self, out: list, message: str) -> None:
        while self._queue:
            out.append(Failed(self._queue.popleft().id, "server_error", message))

    def _take_chunk(self) -> list[EmbedJob]:
        chunk: list[EmbedJob] = []
        longest = 0
        while self._queue:
            job = self._queue[0]
            wide = max(longest, len(job.tokens))
            if chunk and wide * (len(chunk) + 1) > self.chunk_tokens:
                break
            chunk.append(self._queue.popleft())
            longest = wide
        return chunk

    def step(self, out: list) -> None:
        """One chunk: one forward over the oldest queued jobs."""
        chunk = self._take_chunk()
        if not chunk:
            return
        try:
            out.extend(self.run(chunk))
        except Exception as exc:  # the chunk fails, never the thread
            log.exception("embedding step failed")
            out.extend(Failed(job.id, "server_error", f"{type(exc).__name__}: {exc}")
                       for job in chunk)

    def run(self, jobs: list[EmbedJob]) -> list[Embedded]:
        """The results of `jobs`, computed in one batch (jobs of different
        poolings are grouped by pooling, one forward per group)."""
        results: dict[int, Embedded] = {}
        groups: dict[bool, list[EmbedJob]] = {}
        for job in jobs:
            groups.setdefault(job.pooling == "rank", []).append(job)
        for rank, group in groups.items():
            for job, ev in zip(group, self._forward(group, rank)):
                results[job.id] = ev
        self.n_inputs += len(jobs)
        self.n_tokens += sum(len(j.tokens) for j in jobs)
        return [results[job.id] for job in jobs]

    def _forward(self, jobs: list[EmbedJob], rank: bool) -> list[Embedded]:
        import mlx.core as mx

        B = len(jobs)
        L = max(len(j.tokens) for j in jobs)
        ids = np.full((B, L), self.info.pad_token_id, np.int32)
        mask = np.zeros((B, L), np.int32)
        types = np.zeros((B, L), np.int32)
        for i, job in enumerate(jobs):
            n = len(job.tokens)
            ids[i, :n] = job.tokens
            mask[i, :n] = 1
            if job.token_types is not None:
                types[i, :n] = job.token_types
        ids_m, mask_m, types_m = mx.array(ids), mx.array(mask), mx.array(types)
        if rank:
            logits = self.model.classify(ids_m, mask_m, types_m)
            scores = np.array(logits.astype(mx.float32))
            return [Embedded(job.id, scores[i:i + 1, :1].copy(), len(job.tokens))
                    for i, job in enumerate(jobs)]
        hidden = self.model(ids_m, mask_m, types_m)
        out: list[Embedded | None] = [None] * B
        by_pool: dict[str, list[int]] = {}
        for i, job in enumerate(jobs):
            by_pool.setdefault(job.pooling, []).append(i)
        for kind, rows in by_pool.items():
            if kind == "none":
                h = np.array(hidden[mx.array(rows)].astype(mx.float32))
                for r, i in enumerate(rows):
                    out[i] = Embedded(jobs[i].id, h[r, :len(jobs[i].tokens)].copy(),
                                      len(jobs[i].tokens))
                continue
            sel = mx.array(rows)
            pooled = self.model.project(pool(hidden[sel], mask_m[sel], kind))
            vecs = np.array(pooled.astype(mx.float32))
            for r, i in enumerate(rows):
                vec = normalize(vecs[r], jobs[i].normalize)
                out[i] = Embedded(jobs[i].id, vec[None, :], len(jobs[i].tokens))
        return out  # type: ignore[return-value]


def _body_config(path: str) -> dict:
    import json
    from pathlib import Path

    from .encoders import sentence

    pipeline = sentence.read_pipeline(Path(path))
    root = pipeline.transformer_dir if pipeline else Path(path)
    return json.loads((root / "config.json").read_text())


def is_encoder(path: str) -> bool:
    """Whether `path` is one of engine/encoders' families (else: a decoder)."""
    from .encoders.loader import FAMILIES

    try:
        return str(_body_config(path).get("model_type")) in FAMILIES
    except (OSError, ValueError):
        return True  # let the encoder loader say what is wrong


def checkpoint_problem(path: str, flag: str, *, rank: bool) -> str | None:
    """Why `path` cannot serve `flag` (--embeddings / --reranking), or None;
    asked before anything loads.  An embedder is an encoder, or a causal
    checkpoint mlx-lm can build; a reranker must be a cross-encoder."""
    from pathlib import Path

    from .architectures import problem
    from .encoders.loader import EncoderLoadError, pick_class

    from .encoders.decoder import is_qwen3_reranker

    try:
        config = _body_config(path)
        if rank and not is_encoder(path) and is_qwen3_reranker(path):
            why = problem(path)
            return None if why is None else f"{flag}: {why}"
        if not rank and not is_encoder(path):
            why = problem(path)
            if why is None:
                return None if (Path(path) / "tokenizer.json").is_file() else (
                    f"{flag}: the checkpoint has no tokenizer.json")
            return (f"{flag} needs an encoder checkpoint (BERT, RoBERTa or XLM-RoBERTa) or a "
                    f"causal checkpoint mlx-lm can build: {why}")
        cls = pick_class(config)
    except (OSError, ValueError, EncoderLoadError) as exc:
        if rank:
            return (f"{flag} needs a reranker (a ...ForSequenceClassification cross-encoder: "
                    f"BERT, RoBERTa or XLM-RoBERTa, or a Qwen3-Reranker): {exc}")
        return (f"{flag} needs an encoder checkpoint (BERT, RoBERTa or XLM-RoBERTa, as "
                f"sentence-transformers lays them out): {exc}")
    if not (Path(path) / "tokenizer.json").is_file():
        return f"{flag}: the checkpoint has no tokenizer.json"
    if rank and not cls.__name__.endswith("ForSequenceClassification"):
        return (f"{flag} needs a reranker (a ...ForSequenceClassification cross-encoder); "
                f"{config.get('architectures') or config.get('model_type')} is an embedder: "
                "start it with --embeddings instead")
    return None

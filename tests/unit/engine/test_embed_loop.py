"""engine/loop.py with encoders: an encoder alone (NoChat), a cancelled
embedding job dropped before its chunk, and embedding chunks interleaved
with a chat model's decode steps."""

from __future__ import annotations

import queue
import threading

from tokenizers import Tokenizer

from mlxcel_trio.engine.loop import EngineLoop
from mlxcel_trio.engine.preflight import model_problem
from mlxcel_trio.engine.spec import EngineSpec
from mlxcel_trio.protocol.records import (
    Cancel,
    EmbedJob,
    Embedded,
    Failed,
    Finished,
    Job,
    Loaded,
    SamplingParams,
    Shutdown,
    Submit,
    TokenPiece,
)
from mlxcel_trio.server.http.errors import ApiError

WAIT_S = 60


def _ensure(kind):
    from fixtures.build import ensure
    return ensure(kind)


class Run:
    """An EngineLoop on its own thread; every event it emits, in order."""

    def __init__(self, model, commands=(), **kw) -> None:
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.steps: list[tuple] = []
        kw.setdefault("batch_size", 2048)

        def emit(batch):
            self.steps.append(batch.events)
            for ev in batch.events:
                self.events.put(ev)

        self.loop = EngineLoop(EngineSpec(str(model), n_slots=2, ctx_size=512, warmup=False,
                                          cache_ram_mib=0, **kw), emit)
        for cmd in commands:  # queued before the thread reads any
            self.loop.post(cmd)
        self.thread = threading.Thread(target=self.loop.run, daemon=True)
        self.thread.start()

    def until(self, done) -> list:
        seen = []
        while not done(seen):
            seen.append(self.events.get(timeout=WAIT_S))
        return seen

    def stop(self) -> None:
        self.loop.post(Shutdown())
        self.thread.join(WAIT_S)


def _ended(job_ids):
    def done(seen):
        return {ev.job_id for ev in seen
                if isinstance(ev, (Embedded, Failed, Finished))} >= set(job_ids)
    return done


def test_an_encoder_alone_serves_embed_jobs_and_refuses_generation():
    path = _ensure("tiny-bert")
    ids = tuple(Tokenizer.from_file(str(path / "tokenizer.json")).encode("hello there").ids)
    commands = [Submit(EmbedJob(1, ids)), Submit(EmbedJob(2, ids)), Cancel(2),
                Submit(EmbedJob(3, ids, "rank")), Submit(Job(4, (5, 6), n_predict=2))]
    run = Run(path, commands, encoder_only="embed")
    try:
        seen = run.until(_ended([1, 3, 4]))
        info = next(ev.info for ev in seen if isinstance(ev, Loaded))
        assert not info.generates and info.embedder.pooling == "mean" and info.reranker is None
        assert run.loop.embed_vocab is run.loop.vocab is not None
        by_id = {ev.job_id: ev for ev in seen if hasattr(ev, "job_id")}
        assert isinstance(by_id[1], Embedded) and by_id[1].n_tokens == len(ids)
        assert 2 not in by_id  # cancelled before its chunk ran
        refused = {i: ApiError.from_failed(by_id[i]) for i in (3, 4)}
        assert refused[3].type == "not_supported_error" and "reranking" in refused[3].message
        assert refused[4].type == "not_supported_error"
    finally:
        run.stop()


def test_a_cross_encoder_asked_to_embed_takes_the_rank_role():
    path = _ensure("tiny-bert-reranker")
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    enc = tok.encode("q", "d")
    run = Run(path, [Submit(EmbedJob(1, tuple(enc.ids), "rank", -1, tuple(enc.type_ids)))],
              encoder_only="embed")
    try:
        seen = run.until(_ended([1]))
        info = next(ev.info for ev in seen if isinstance(ev, Loaded))
        assert info.embedder is None and info.reranker.pooling == "rank"
        assert run.loop.rerank_vocab is not None
        assert isinstance(seen[-1], Embedded) and seen[-1].vectors.shape == (1, 1)
    finally:
        run.stop()


def test_embedding_chunks_interleave_with_decode_steps():
    chat = _ensure("tiny")
    bert = _ensure("tiny-bert")
    ids = tuple(Tokenizer.from_file(str(bert / "tokenizer.json")).encode("a b c d").ids)
    n_embed = 12
    # chunks of two inputs: the embedding work takes six steps
    commands = [Submit(Job(100, (5, 6, 7), n_predict=8,
                           sampling=SamplingParams(temperature=0.0)))]
    commands += [Submit(EmbedJob(i, ids)) for i in range(n_embed)]
    run = Run(chat, commands, embedding_model=str(bert), batch_size=2 * len(ids))
    try:
        run.until(_ended([100, *range(n_embed)]))
        info_steps = [s for s in run.steps if any(isinstance(e, Loaded) for e in s)]
        assert info_steps and info_steps[0][0].info.generates
        work = [s for s in run.steps if any(isinstance(e, (Embedded, TokenPiece)) for e in s)]
        for step in work:  # never more than one chunk of embeddings between two steps
            assert sum(isinstance(e, Embedded) for e in step) <= 2
        tokens_at = [i for i, s in enumerate(work) if any(isinstance(e, TokenPiece) for e in s)]
        embeds_at = [i for i, s in enumerate(work) if any(isinstance(e, Embedded) for e in s)]
        # decode went on while the embedding queue drained
        assert tokens_at[0] < embeds_at[-1] and embeds_at[0] < tokens_at[-1]
    finally:
        run.stop()


def test_checkpoint_problem_names_the_flag(tmp_path):
    chat = str(_ensure("tiny"))
    # a causal checkpoint embeds (mlx-lm's hidden states) but cannot rerank
    assert model_problem(chat, encoder_flag="--embeddings") is None
    problem = model_problem(chat, encoder_flag="--reranking", rank=True)
    assert problem is not None and problem.startswith("--reranking needs a reranker")
    (tmp_path / "config.json").write_text('{"model_type": "no-such-family"}')
    problem = model_problem(str(tmp_path), encoder_flag="--embedding-model")
    assert problem is not None and problem.startswith("--embedding-model needs an encoder")
    assert model_problem(str(_ensure("tiny-bert-reranker")),
                         encoder_flag="--reranking", rank=True) is None


def test_embeddings_are_served_while_the_chat_model_sleeps():
    from mlxcel_trio.protocol.records import Sleeping, Woke

    chat = _ensure("tiny")
    bert = _ensure("tiny-bert")
    ids = tuple(Tokenizer.from_file(str(bert / "tokenizer.json")).encode("a b c").ids)
    run = Run(chat, embedding_model=str(bert), sleep_idle_s=0.2)
    try:
        run.until(lambda seen: any(isinstance(e, Sleeping) for e in seen))
        for i in range(1, 4):
            run.loop.post(Submit(EmbedJob(i, ids)))
        seen = run.until(_ended([1, 2, 3]))
        assert not any(isinstance(e, Woke) for e in seen)  # the chat model slept on
        run.loop.post(Submit(Job(9, (5, 6), n_predict=2, sampling=SamplingParams(temperature=0))))
        seen = run.until(_ended([9]))
        assert any(isinstance(e, Woke) for e in seen)
        assert isinstance(seen[-1], Finished)
    finally:
        run.stop()

"""engine/embedder.py: upstream's normalization arithmetic, the pooling
kernels over right-padded batches, chunking by the batch size, cancellation,
and the refusals a job gets at submission."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
from tokenizers import Tokenizer

from mlxcel_trio.engine.embedder import Embedder, normalize, pool
from mlxcel_trio.protocol.records import EmbedJob, Embedded, Failed
from mlxcel_trio.server.http.errors import ApiError

TEXTS = ["The cat jumps over the fence.", "a", "some longer sentence about the harbour and tea"]


@pytest.fixture(scope="module")
def bert_dir():
    from fixtures.build import ensure
    return ensure("tiny-bert")


@pytest.fixture(scope="module")
def tok(bert_dir):
    return Tokenizer.from_file(str(bert_dir / "tokenizer.json"))


def _embedder(path, **kw) -> Embedder:
    kw.setdefault("n_batch", 512)
    kw.setdefault("chunk_tokens", 2048)
    return Embedder.load(str(path), **kw)


# -- normalization -------------------------------------------------------------------

@pytest.mark.parametrize("kind,scale", [
    (-1, lambda v: 1.0),
    (0, lambda v: max(abs(x) for x in v) / 32760.0),
    (1, lambda v: sum(abs(x) for x in v)),
    (2, lambda v: math.sqrt(sum(x * x for x in v))),
    (3, lambda v: sum(abs(x) ** 3 for x in v) ** (1 / 3)),
    (7, lambda v: sum(abs(x) ** 7 for x in v) ** (1 / 7)),
])
def test_normalize_is_upstreams_arithmetic(kind, scale):
    v = [0.5, -2.0, 0.25, 3.0]
    np.testing.assert_allclose(normalize(np.array(v, np.float32), kind),
                               [x / scale(v) for x in v], rtol=1e-6)


@pytest.mark.parametrize("kind", [-1, 0, 1, 2, 3])
def test_a_zero_vector_stays_zero(kind):
    out = normalize(np.zeros(4, np.float32), kind)
    assert out.dtype == np.float32 and not np.any(out) and np.all(np.isfinite(out))


def test_max_abs_lands_in_the_int16_range():
    out = normalize(np.array([0.1, -0.4, 0.2], np.float32), 0)
    assert out[1] == pytest.approx(-32760.0)


# -- pooling kernels ------------------------------------------------------------------

def test_pooling_reads_only_each_rows_real_tokens():
    rng = np.random.default_rng(0)
    hidden = rng.standard_normal((2, 5, 3)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)
    h, m = mx.array(hidden), mx.array(mask)
    np.testing.assert_allclose(np.array(pool(h, m, "mean"))[0], hidden[0, :3].mean(0), rtol=1e-6)
    np.testing.assert_allclose(np.array(pool(h, m, "mean"))[1], hidden[1].mean(0), rtol=1e-6)
    np.testing.assert_array_equal(np.array(pool(h, m, "cls")), hidden[:, 0])
    np.testing.assert_array_equal(np.array(pool(h, m, "last")), hidden[[0, 1], [2, 4]])


# -- jobs -------------------------------------------------------------------------------

def test_batched_equals_single_and_results_keep_job_order(bert_dir, tok):
    emb = _embedder(bert_dir)
    jobs = [EmbedJob(i, tuple(tok.encode(t).ids), p, n)
            for i, (t, p, n) in enumerate(zip(TEXTS * 2, ["mean", "cls", "last", "none",
                                                          "mean", "mean"], [2, -1, 1, 2, 0, 3]))]
    out: list = []
    for job in jobs:
        emb.submit(job, out)
    assert out == [] and emb.pending
    emb.step(out)
    assert not emb.pending and [ev.job_id for ev in out] == [j.id for j in jobs]
    for job, ev in zip(jobs, out):
        assert isinstance(ev, Embedded) and ev.n_tokens == len(job.tokens)
        alone = emb.run([job])[0]
        np.testing.assert_allclose(ev.vectors, alone.vectors, atol=1e-6)
    assert out[3].vectors.shape == (len(jobs[3].tokens), 64)  # pooling none: per token
    assert all(ev.vectors.shape == (1, 64) for i, ev in enumerate(out) if i != 3)


def test_chunks_stay_within_the_batch_size(bert_dir, tok):
    ids = tuple(tok.encode(TEXTS[2]).ids)
    emb = _embedder(bert_dir, chunk_tokens=len(ids) * 2)
    out: list = []
    for i in range(5):
        emb.submit(EmbedJob(i, ids), out)
    sizes = []
    while emb.pending:
        before = len(out)
        emb.step(out)
        sizes.append(len(out) - before)
    assert sizes == [2, 2, 1]
    # an input wider than a chunk still runs, alone
    emb = _embedder(bert_dir, chunk_tokens=1)
    emb.submit(EmbedJob(9, ids), out)
    emb.step(out)
    assert isinstance(out[-1], Embedded) and out[-1].job_id == 9


def test_a_cancelled_job_is_dropped(bert_dir, tok):
    emb = _embedder(bert_dir)
    out: list = []
    for i in range(3):
        emb.submit(EmbedJob(i, tuple(tok.encode(TEXTS[i]).ids)), out)
    assert emb.cancel(1) and not emb.cancel(1) and not emb.cancel(42)
    emb.step(out)
    assert [ev.job_id for ev in out] == [0, 2]


def test_submission_refusals_use_upstreams_words(bert_dir):
    emb = _embedder(bert_dir, n_batch=8)
    out: list = []
    emb.submit(EmbedJob(1, ()), out)
    emb.submit(EmbedJob(2, (2, 1000, 3)), out)
    emb.submit(EmbedJob(3, (2, -1)), out)
    emb.submit(EmbedJob(4, tuple(range(5, 14))), out)
    emb.submit(EmbedJob(5, (2, 5, 3), "rank"), out)
    assert not emb.pending and all(isinstance(ev, Failed) for ev in out)
    answered = [ApiError.from_failed(ev) for ev in out]  # coded ones in the server's words
    assert [(ev.job_id, a.type) for ev, a in zip(out, answered)] == [
        (1, "invalid_request_error"), (2, "invalid_request_error"),
        (3, "invalid_request_error"), (4, "server_error"), (5, "not_supported_error")]
    assert answered[0].message == "Input content cannot be empty"
    assert answered[1].message == answered[2].message == "Prompt contains invalid tokens"
    assert answered[3].message == ("input (9 tokens) is too large to process. increase the "
                              "physical batch size (current batch size: 8)")


def test_rank_needs_a_classifier_and_scores_are_its_logits():
    from fixtures.build import ensure
    path = ensure("tiny-bert-reranker")
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    emb = _embedder(path, pooling="rank")
    enc = [tok.encode("where?", d) for d in ("here", "a much longer document than that")]
    jobs = [EmbedJob(i, tuple(e.ids), "rank", -1, tuple(e.type_ids)) for i, e in enumerate(enc)]
    got = emb.run(jobs)
    for e, ev in zip(enc, got):
        a = mx.array([e.ids])
        want = emb.model.classify(a, mx.ones_like(a), mx.array([e.type_ids]))
        assert ev.score == pytest.approx(float(np.array(want)[0, 0]), abs=1e-5)
    with pytest.raises(ValueError, match="needs a classifier"):
        Embedder.load(str(ensure("tiny-bert")), n_batch=8, chunk_tokens=8, pooling="rank")


def test_a_decoder_embeds_with_mlx_lms_hidden_states_batched_as_single():
    from fixtures.build import ensure
    from mlx_lm import load as lm_load

    path = ensure("tiny")
    emb = _embedder(path)
    assert emb.pooling == "none" and emb.info.architecture == "Qwen3ForCausalLM"
    lm, _ = lm_load(str(path))
    rows = [(5, 6, 7, 8, 9, 10), (11, 12), (13, 14, 15)]
    jobs = [EmbedJob(i, r, p, 2) for i, (r, p) in enumerate(zip(rows, ["last", "mean", "none"]))]
    got = emb.run(jobs)
    for job, ev in zip(jobs, got):
        h = np.array(lm.model(mx.array([list(job.tokens)])))[0]
        want = {"last": lambda: normalize(h[-1], 2), "mean": lambda: normalize(h.mean(0), 2),
                "none": lambda: h}[job.pooling]()
        np.testing.assert_allclose(ev.vectors.reshape(want.shape), want, atol=1e-5)
        np.testing.assert_allclose(ev.vectors, emb.run([job])[0].vectors, atol=1e-6)


def test_a_qwen3_reranker_scores_batched_as_single(tmp_path):
    from fixtures.build import ensure
    from mlx_lm import load as lm_load

    from ._decoder_reranker import qwen3_reranker

    path = qwen3_reranker(ensure("tiny"), tmp_path)
    emb = _embedder(path, pooling="rank")
    assert emb.public.rerank_template is not None and emb.info.labels == ("yes", "no")
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    yes, no = tok.token_to_id("yes"), tok.token_to_id("no")
    lm, _ = lm_load(str(path))
    jobs = [EmbedJob(i, tuple(tok.encode(t, add_special_tokens=False).ids), "rank", -1)
            for i, t in enumerate(TEXTS)]
    for job, ev in zip(jobs, emb.run(jobs)):
        logits = np.array(lm(mx.array([list(job.tokens)])))[0, -1, [yes, no]]
        want = np.exp(logits[0]) / np.exp(logits).sum()
        assert ev.score == pytest.approx(float(want), abs=1e-5)
        assert ev.score == pytest.approx(emb.run([job])[0].score, abs=1e-6)
    # without the reranker's name it is a plain decoder: it embeds, it cannot rank
    plain = _embedder(ensure("tiny"))
    assert plain.public.rerank_template is None and not plain.info.is_classifier

"""Continuous batching over a fixed set of slots.

Theory of operation: mlx-lm's `BatchGenerator` owns the tensors (KV caches,
the prefill batch, the decode batch) and interleaves one prefill chunk of
`batch_size` tokens with one decode step per `next()` call.  This module owns
everything a llama-server client can see: which slot serves a job, when a job
waits for a slot, detokenization, stop strings, the n_predict / context /
indent / time limits, and timings.

Rules:
- Single-threaded: only the engine thread calls into a `Scheduler`.
- A cancelled or finished job is removed from the generator before the next
  `step()` runs a forward pass, so it never costs another token.
- A job holds its slot from admission until `SlotFreed` is emitted.
"""

from __future__ import annotations

import time
from collections import deque

import attrs
from mlx_lm.generate import BatchGenerator

from .detokenizer import IncrementalDetokenizer
from .records import (
    Failed,
    Finished,
    Job,
    PromptProgress,
    SlotFreed,
    Started,
    Timings,
    TokenPiece,
    TokenProbs,
)
from .samplers.batch import BatchSampler, dry_on
from .samplers.history import breakers_for
from .sampling import GREEDY, plan
from .stops import StopMatcher
from .vocab import Vocab


def _ms_since(t0: float, now: float) -> float:
    return (now - t0) * 1e3


class _Sequence:
    """Per-job state while the job holds a slot (engine thread only)."""

    __slots__ = (
        "job", "slot", "uid", "detok", "stops", "tokens", "content", "max_tokens",
        "stop_type", "stopping_word", "truncated", "t_start", "t_first",
        "t_prompt_ms", "last_nl_pos", "done", "processed", "row", "probs",
    )

    def __init__(self, job: Job, slot: int, vocab: Vocab, max_tokens: int) -> None:
        self.job = job
        self.slot = slot
        self.uid: int | None = None
        self.detok = IncrementalDetokenizer(vocab.table)
        self.stops = StopMatcher(job.stop)
        self.tokens: list[int] = []
        self.content: list[str] = []
        self.max_tokens = max_tokens
        self.stop_type = "none"
        self.stopping_word = ""
        self.truncated = False
        self.t_start = time.perf_counter()
        self.t_first: float | None = None
        self.t_prompt_ms = 0.0
        self.last_nl_pos = 0
        self.done = False
        self.processed = -1
        self.row = None                     # sampler state (samplers/batch.Row)
        self.probs: list[TokenProbs] = []   # completion_probabilities, when asked

    def timings(self, now: float) -> Timings:
        n = len(self.tokens)
        return Timings(
            cache_n=0,
            prompt_n=len(self.job.prompt),
            prompt_ms=self.t_prompt_ms,
            predicted_n=n,
            predicted_ms=_ms_since(self.t_first, now) if self.t_first and n > 1 else 0.0,
        )


class Scheduler:
    def __init__(self, model, vocab: Vocab, *, n_slots: int, n_ctx_slot: int,
                 batch_size: int, special: bool = False) -> None:
        self.vocab = vocab
        self._render_special = special  # -sp: special tokens appear in the text
        self.n_slots = n_slots
        self.n_ctx_slot = n_ctx_slot
        self._model = model
        self._batch_size = batch_size
        self._eos_bias = tuple((t, float("-inf")) for t in sorted(vocab.eos_ids))
        self._gen = self._new_generator()
        self._pending: deque[Job] = deque()
        self._free = list(range(n_slots))
        self._by_uid: dict[int, _Sequence] = {}
        self._by_job: dict[int, _Sequence] = {}

    def _new_generator(self) -> BatchGenerator:
        # the chain rows' shared sampler lives and dies with its generator
        self._batch = BatchSampler(self.vocab.n_vocab)
        return BatchGenerator(
            self._model,
            sampler=GREEDY,
            completion_batch_size=self.n_slots,
            prefill_batch_size=self.n_slots,
            prefill_step_size=self._batch_size,
        )

    # -- commands ------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return bool(self._by_job) or bool(self._pending)

    def submit(self, job: Job, out: list) -> None:
        if job.id_slot >= self.n_slots or job.id_slot < -1:
            out.append(Failed(job.id, "invalid_request_error", "Invalid slot ID"))
            return
        if any(t < 0 or t >= self.vocab.n_vocab for t in job.prompt):
            out.append(Failed(job.id, "invalid_request_error", "Prompt contains invalid tokens"))
            return
        n = len(job.prompt)
        if n >= self.n_ctx_slot:
            out.append(Failed(
                job.id, "exceed_context_size_error",
                f"request ({n} tokens) exceeds the available context size "
                f"({self.n_ctx_slot} tokens), try increasing it",
                (("n_prompt_tokens", n), ("n_ctx", self.n_ctx_slot)),
            ))
            return
        self._pending.append(job)
        self._admit(out)

    def cancel(self, job_id: int, out: list) -> None:
        seq = self._by_job.get(job_id)
        if seq is None:
            self._pending = deque(j for j in self._pending if j.id != job_id)
            return
        self._release(seq, out, cancelled=True)
        self._admit(out)

    def close(self, out: list) -> None:
        """Cancel everything and wait for in-flight MLX work: the process may
        exit right after, and MLX must not be mid-evaluation then."""
        import mlx.core as mx

        for seq in list(self._by_job.values()):
            self._release(seq, out, cancelled=True)
        self._pending.clear()
        mx.synchronize(self._gen.stream)  # the generator computes on its own stream
        mx.synchronize()

    def fail_all(self, out: list, message: str) -> None:
        """After a failed step: every admitted job fails with a server error
        and the generator starts over empty; queued jobs are kept."""
        for seq in list(self._by_job.values()):
            out.append(Failed(seq.job.id, "server_error", message))
            seq.uid = None  # the old generator is dropped whole below
            self._release(seq, out, cancelled=False)
        self._by_uid.clear()
        self._gen = self._new_generator()
        self._admit(out)

    # -- the step --------------------------------------------------------------

    def step(self, out: list) -> None:
        """One prefill chunk and/or one decode step for everything admitted."""
        if not self._by_job:
            return
        self._batch.reset()
        prompt_resps, gen_resps = self._gen.next()
        now = time.perf_counter()
        for r in prompt_resps:
            seq = self._by_uid.get(r.uid)
            if seq is not None and seq.job.return_progress:
                self._progress(seq, r.progress[0], now, out)
        finished: list[_Sequence] = []
        for r in gen_resps:
            seq = self._by_uid.get(r.uid)
            if seq is None or seq.done:
                continue
            self._on_token(seq, r.token, now, out)
            if seq.done:
                finished.append(seq)
        for seq in finished:
            self._finish(seq, now, out)
        if finished:
            self._admit(out)

    # -- internals -------------------------------------------------------------

    def _admit(self, out: list) -> None:
        """Move waiting jobs into free slots (FIFO, honoring id_slot)."""
        waiting: deque[Job] = deque()
        while self._pending and self._free:
            job = self._pending.popleft()
            if job.id_slot == -1:
                slot = self._free.pop(0)
            elif job.id_slot in self._free:
                slot = job.id_slot
                self._free.remove(slot)
            else:
                waiting.append(job)
                continue
            self._start(job, slot, out)
        waiting.extend(self._pending)
        self._pending = waiting

    def _start(self, job: Job, slot: int, out: list) -> None:
        n_prompt = len(job.prompt)
        room = self.n_ctx_slot - n_prompt
        # n_predict 0 still yields one token, as upstream does.
        want = room if job.n_predict < 0 else max(1, job.n_predict)
        seq = _Sequence(job, slot, self.vocab, min(want, room))
        self._by_job[job.id] = seq
        out.append(Started(job.id, slot, n_prompt, 0))
        if job.return_progress:
            self._progress(seq, 0, seq.t_start, out)
        if n_prompt == 0:
            # Upstream answers an empty prompt with an empty final result.
            seq.done = True
            self._finish(seq, time.perf_counter(), out)
            return
        sampler, processors, seq.row = self._sampling_plan(job)
        (uid,) = self._gen.insert([list(job.prompt)], max_tokens=[seq.max_tokens],
                                  samplers=[sampler], logits_processors=[processors])
        seq.uid = uid
        self._by_uid[uid] = seq

    def _sampling_plan(self, job: Job):
        params = job.sampling
        if job.ignore_eos:
            # upstream's logit_bias_eog: every end-of-generation token banned
            params = attrs.evolve(params, logit_bias=params.logit_bias + self._eos_bias)
        breakers = (breakers_for(self.vocab, params.dry_sequence_breakers)
                    if dry_on(params) else None)
        constraint = job.grammar.start(len(job.prompt)) if job.grammar is not None else None
        return plan(params, self.vocab.n_vocab, self._batch, breakers=breakers,
                    constraint=constraint)

    def _progress(self, seq: _Sequence, processed: int, now: float, out: list) -> None:
        if processed == seq.processed:
            return
        seq.processed = processed
        out.append(PromptProgress(seq.job.id, len(seq.job.prompt), 0, processed,
                                  _ms_since(seq.t_start, now)))

    def _on_token(self, seq: _Sequence, token: int, now: float, out: list) -> None:
        """Upstream's process_token: stop word, n_predict, indent, time,
        context bound, then EOS (a later check overrides the stop type)."""
        job = seq.job
        if seq.t_first is None:
            seq.t_first = now
            seq.t_prompt_ms = _ms_since(seq.t_start, now)
        seq.tokens.append(token)
        probs = self._token_probs(seq, token)
        vocab = self.vocab
        is_eos = token in vocab.eos_ids and not job.ignore_eos
        if not self._render_special and vocab.table.is_special(token):
            text, complete = "", seq.detok.pending_bytes == 0
        else:
            text = seq.detok.push(token)
            complete = seq.detok.pending_bytes == 0
        r = seq.stops.feed(text)
        emit = r.emit
        if r.stopped:
            seq.stop_type, seq.stopping_word, seq.done = "word", r.word, True
        seq.content.append(emit)
        n = len(seq.tokens)
        if not seq.done and n >= seq.max_tokens:
            seq.stop_type, seq.done = "limit", True
            # Upstream flags truncation whenever the slot's context is full.
            seq.truncated = len(job.prompt) + n >= self.n_ctx_slot
        if job.n_indent > 0:
            self._check_indent(seq)
        if (not seq.done and job.t_max_predict_ms > 0 and "\n" in emit
                and _ms_since(seq.t_first, now) > job.t_max_predict_ms):
            seq.stop_type, seq.done = "limit", True
        if is_eos:
            seq.stop_type, seq.done = "eos", True
        if seq.done and seq.stop_type != "word":
            # The last token releases everything still held back, as
            # upstream's last partial frame does.
            tail = self._drain(seq)
            emit += tail
            seq.content.append(tail)
        out.append(TokenPiece(job.id, token, emit, n, complete or seq.done, seq.done,
                              seq.timings(now), probs))

    @staticmethod
    def _token_probs(seq: _Sequence, token: int) -> TokenProbs | None:
        row = seq.row
        if row is None or not row.reports:
            return None
        ids, ps, tok_p = row.reports.popleft()
        top = tuple((i, p) for i, p in zip(ids.tolist(), ps.tolist()))
        if row.params.post_sampling_probs:
            # upstream stops at the first zero-probability candidate
            top = tuple(e for e in top if e[1] > 0.0)
        probs = TokenProbs(token, float(tok_p.item()), top)
        seq.probs.append(probs)
        return probs

    @staticmethod
    def _drain(seq: _Sequence) -> str:
        """Flush the detokenizer and the stop matcher at the end of a job; a
        stop string can still complete in what they held."""
        stops = seq.stops
        r = stops.feed(seq.detok.flush())
        text = r.emit if r.stopped else r.emit + stops.flush()
        if stops.stopped:
            seq.stop_type, seq.stopping_word = "word", stops.word
        return text

    def _check_indent(self, seq: _Sequence) -> None:
        """Stop once a generated line is indented less than n_indent; the
        cursor moves one line per token, as upstream's does."""
        text = "".join(seq.content)
        pos = seq.last_nl_pos
        if pos > 0:
            width = 0
            while pos < len(text) and text[pos] in " \t":
                width += 1
                pos += 1
            if pos < len(text) and width < seq.job.n_indent:
                seq.stop_type, seq.done = "limit", True
                seq.content = [text[:pos]]
                text = text[:pos]
        nl = text.find("\n", seq.last_nl_pos)
        if nl != -1:
            seq.last_nl_pos = nl + 1

    def _finish(self, seq: _Sequence, now: float, out: list) -> None:
        out.append(Finished(
            job_id=seq.job.id, id_slot=seq.slot, content="".join(seq.content),
            tokens=tuple(seq.tokens), stop_type=seq.stop_type,
            stopping_word=seq.stopping_word, truncated=seq.truncated,
            n_prompt=len(seq.job.prompt), timings=seq.timings(now), probs=tuple(seq.probs),
        ))
        self._release(seq, out, cancelled=False)

    def _release(self, seq: _Sequence, out: list, cancelled: bool) -> None:
        seq.done = True
        if seq.uid is not None:
            self._gen.remove([seq.uid])
            del self._by_uid[seq.uid]
        del self._by_job[seq.job.id]
        self._free.append(seq.slot)
        self._free.sort()
        out.append(SlotFreed(seq.slot, seq.job.id, cancelled))

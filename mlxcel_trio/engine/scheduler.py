"""Continuous batching over a fixed set of slots.

Theory of operation: mlx-lm's `BatchGenerator` owns the tensors (KV caches,
the prefill batch, the decode batch) and interleaves one prefill chunk of
`batch_size` tokens with one decode step per `next()` call.  This module owns
everything a llama-server client can see: which slot serves a job, when a job
waits for a slot, detokenization, stop strings, the n_predict / context /
indent / time limits, context shift, and timings.

Context: a prompt that does not fit a slot is refused at admission.  With
--context-shift off (upstream's default) a generation stops at the slot's
bound (`truncated`, stop type "limit"); with it on, the sequence is shifted
before it would fill the last cell (engine/context_shift.py) and continues.
Under unified KV (kv_budget.py) the slot's bound is the whole context and
the slots share it as one budget: a job waits for room as it waits for a
slot, and when the live sequences outgrow the budget they all fail as
upstream's do.

--no-cont-batching (upstream's gate `cont_batching || batch.size() == 0`):
a job takes its slot at once, but its prompt enters the generator only
while no admitted sequence has reached decoding, so prefill never
interleaves with decode.

Rules:
- Single-threaded: only the engine thread calls into a `Scheduler`.
- A cancelled or finished job is removed from the generator before the next
  `step()` runs a forward pass, so it never costs another token.
- A job holds its slot from admission until `SlotFreed` is emitted.
- The prompt cache (prompt_cache.py) is consulted once at admission and fed
  once at release; nothing of it runs per decode step.  For a model whose
  caches cannot be cut back (sliding window, recurrent state) the prompt is
  also inserted in segments that end at reuse points (`reuse_points`), and
  the state after each segment is stored as a snapshot.
- With LoRA adapters loaded (lora.py), every sequence's cache list ends with
  its scale vector (`AdapterRows`), which mlx-lm's batch bookkeeping carries
  with the KV; the prompt cache keys entries by that vector too.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Callable

import attrs
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import make_prompt_cache

from ..protocol.kv_types import DEFAULT_PAIR as DEFAULT_KV
from ..protocol.records import (
    CacheStats,
    Failed,
    Finished,
    Job,
    PromptProgress,
    SamplingParams,
    SlotAction,
    SlotFreed,
    SlotTokens,
    Started,
    Timings,
    TokenPiece,
    TokenProbs,
)
from . import cache_kinds, context_shift, kv_shift
from .kv_budget import CONTEXT_EXCEEDED, KvBudget, total_held
from .detokenizer import IncrementalDetokenizer
from .kv_cache import CacheFactory
from .lora import AdapterRows, split_rows
from .prompt_cache import SNAPSHOT_EVERY, PromptCache, needs_snapshots, supported
from .samplers.batch import BatchSampler, dry_on
from .samplers.history import breakers_for
from .sampling import GREEDY, greedy_banning, plan
from .speculative.batch import Plan, SpeculativeBatch
from .speculative.drafters import Chain
from .speculative.rollback import why_not as why_no_rollback
from .stops import StopMatcher
from .vocab import Vocab

log = logging.getLogger("mlxcel.engine")


GREEDY_PARAMS = SamplingParams(temperature=0.0)
REFILL_IDS = -1000  # internal refill jobs take ids below this (warmup uses -1, -2)
# mlx-lm's own max_tokens for a sequence whose bound the scheduler enforces
UNBOUNDED = 2**31 - 1


def _ms_since(t0: float, now: float) -> float:
    return (now - t0) * 1e3


class _Sequence:
    """Per-job state while the job holds a slot (engine thread only)."""

    __slots__ = (
        "job", "slot", "uid", "detok", "stops", "tokens", "content", "max_tokens",
        "stop_type", "stopping_word", "truncated", "t_start", "t_first",
        "t_prompt_ms", "last_nl_pos", "done", "processed", "row", "probs", "n_cache",
        "kv", "sampler", "processors", "prefilled", "n_shifts", "cached", "plan", "scales",
        "ns", "n_kv0", "t_first_decided", "cache_tier",
    )

    def __init__(self, job: Job, slot: int, vocab: Vocab, max_tokens: int,
                 n_adapters: int) -> None:
        self.job = job
        # the LoRA scales this job decodes with (one per loaded adapter), and
        # the prompt-cache namespace they imply: KV computed under other
        # scales is another model's
        self.scales = lora_scales(job.lora, n_adapters)
        self.ns = image_namespace(scaled_namespace(job.cache_ns, self.scales),
                                  (*job.images, *job.audio))
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
        self.t_first_decided: float | None = None  # t_first on the decision clock
        self.t_prompt_ms = 0.0
        self.last_nl_pos = 0
        self.done = False
        self.processed = -1
        self.row = None                     # sampler state (samplers/batch.Row)
        self.probs: list[TokenProbs] = []   # completion_probabilities, when asked
        self.n_cache = 0                    # prompt tokens the prompt cache supplied
        self.cache_tier = "none"            # where they came from: memory, disk, none
        self.n_kv0 = 0                      # tokens `cached` holds (cache or image prefill)
        self.cached = None                  # the prompt cache's KV until inserted
        self.kv: list[int] = list(job.prompt)  # the tokens the sequence's KV holds
        self.sampler = None                 # kept for a context shift's re-insert
        self.processors: list = []
        self.prefilled = False              # its prompt reached decoding
        self.n_shifts = 0
        self.plan = None                    # speculative/batch.Plan while it speculates

    def timings(self, now: float) -> Timings:
        n = len(self.tokens)
        return Timings(
            cache_n=self.n_cache,
            prompt_n=len(self.job.prompt) - self.n_cache,
            prompt_ms=self.t_prompt_ms,
            predicted_n=n,
            predicted_ms=_ms_since(self.t_first, now) if self.t_first and n > 1 else 0.0,
            draft_n=self.plan.draft_n if self.plan else 0,
            draft_n_accepted=self.plan.accepted if self.plan else 0,
            draft_rounds=self.plan.rounds if self.plan else 0,
        )


def lora_scales(requested: tuple[float, ...] | None, n_adapters: int) -> tuple[float, ...]:
    """A job's scale per loaded adapter: what it resolved, zeros elsewhere."""
    given = tuple(requested or ())[:n_adapters]
    return given + (0.0,) * (n_adapters - len(given))


def scaled_namespace(ns: str | None, scales: tuple[float, ...]) -> str | None:
    if ns is None or not any(scales):
        return ns
    return f"{ns}|lora=" + ",".join(repr(float(s)) for s in scales)


def image_namespace(ns: str | None, images) -> str | None:
    """Every image's placeholder tokens are the same ids, so KV computed
    with one picture is keyed by the pictures (in order) as well."""
    if ns is None or not images:
        return ns
    return f"{ns}|images=" + ",".join(im.digest for im in images)


class Scheduler:
    def __init__(self, model, vocab: Vocab, *, n_slots: int, n_ctx_slot: int,
                 batch_size: int, special: bool = False,
                 prompt_cache: PromptCache | None = None, context_shift: bool = False,
                 cont_batching: bool = True, kv_types: tuple[str, str] = DEFAULT_KV,
                 drafter: Chain | None = None, n_adapters: int = 0, vision=None,
                 audio=None, clock: Callable[[], float] | None = None,
                 cache_reuse: int = 0, kv_budget: int | None = None,
                 clear_idle: bool = False) -> None:
        self.vocab = vocab
        self._vision = vision  # an image tower (engine/towers/) for an integrated VLM
        self._audio = audio    # an audio tower (engine/towers/) for a chat model with audio
        # what time-based decisions (t_max_predict_ms) read; None = the step's
        # own time.  Ranks stepping in lockstep share rank 0's (engine/distributed.py)
        self._clock = clock
        self.n_adapters = n_adapters  # the model is lora.AdaptedModel when > 0
        self.context_shift = context_shift
        self.cont_batching = cont_batching
        self._add_bos = bool(getattr(vocab, "add_bos", False))
        self._render_special = special  # -sp: special tokens appear in the text
        self.n_slots = n_slots
        self.n_ctx_slot = n_ctx_slot
        # unified KV (kv_budget.py): None = the split, each slot capped at n_ctx_slot
        self._budget = KvBudget(kv_budget) if kv_budget is not None else None
        # --cache-idle-slots under unified KV: a client job's start clears
        # the idle slots' retained tokens (their KV went to the prompt cache)
        self._clear_idle = clear_idle
        self._model = model
        self._batch_size = batch_size
        self._new_caches = CacheFactory(model, *kv_types)
        problem = self._new_caches.check()
        if problem is not None:
            raise ValueError(problem)
        # speculative decoding (engine/speculative/): None = the plain decode batch
        self._drafter = drafter
        unrolled = why_no_rollback(self._new_caches.layers()) if drafter is not None else None
        if unrolled is not None:
            log.warning("speculative decoding off: this model's %s layers cannot be rolled "
                        "back after a rejected draft", unrolled)
            self._drafter = None
        self._eos_bias = tuple((t, float("-inf")) for t in sorted(vocab.eos_ids))
        self._banned = tuple(sorted(vocab.eos_ids))
        self._greedy_no_eos = greedy_banning(sorted(vocab.eos_ids), vocab.n_vocab)
        self._gen = self._new_generator()
        self._pending: deque[Job] = deque()
        self._free = list(range(n_slots))
        self._by_uid: dict[int, _Sequence] = {}
        self._by_job: dict[int, _Sequence] = {}
        self._held: deque[_Sequence] = deque()  # -nocb: slotted, prompt not inserted
        self._cache = prompt_cache
        if prompt_cache is not None and not supported(self._new_caches.layers()):
            log.warning("prompt cache off: this model keeps a kind of cache it cannot store")
            self._cache = None
        if self._cache is not None:
            self._cache.bind(self._new_caches.layers())
        # chunk reuse by shifting cached keys (kv_shift.py): per request's n_cache_reuse
        self._shifter, why = (kv_shift.for_model(model, self._new_caches.layers())
                              if self._cache is not None else (None, "no prompt cache"))
        if cache_reuse > 0:
            if self._shifter is None:
                log.warning("cache reuse off (--cache-reuse %d is ignored): %s", cache_reuse, why)
            else:
                log.info("cache reuse on: cached chunks of %d or more tokens are shifted "
                         "into a changed prompt", cache_reuse)
        # snapshots at reuse points while prompts prefill (prompt_cache.py)
        self._snapshots = self._cache is not None and needs_snapshots(self._new_caches.layers())
        self._message_ends = frozenset(vocab.eos_ids)
        # each slot's retained token stream (what slot save writes)
        self._slot_tokens: list[tuple[int, ...]] = [() for _ in range(n_slots)]
        self._slot_ns: list[str | None] = [None] * n_slots
        self._refill_ids = REFILL_IDS  # internal jobs re-evaluating restored tokens

    def _new_generator(self) -> BatchGenerator:
        # the chain rows' shared sampler lives and dies with its generator
        self._batch = BatchSampler(self.vocab.n_vocab)
        gen = BatchGenerator(
            self._model,
            sampler=GREEDY,
            completion_batch_size=self.n_slots,
            prefill_batch_size=self.n_slots,
            prefill_step_size=self._batch_size,
        )
        if self._drafter is not None:
            self._drafter.clear()
            # the decode batch is created once and only ever extended, so
            # swapping the empty one in here makes every row's decode pass
            # through the verify step
            gen._generation_batch = SpeculativeBatch.create(self._model, GREEDY, self._drafter)
        return gen

    # -- commands ------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return bool(self._by_job) or bool(self._pending)

    @property
    def n_active(self) -> int:
        """Slots holding a job (the next step computes for each of them)."""
        return len(self._by_job)

    def kv_summary(self) -> str:
        """Which layers store the -ctk / -ctv formats (the load line)."""
        return self._new_caches.summary()

    def submit(self, job: Job, out: list) -> None:
        if job.id_slot >= self.n_slots or job.id_slot < -1:
            out.append(Failed.coded(job.id, "invalid_slot"))
            return
        if not self._in_vocab(job.prompt):
            out.append(Failed.coded(job.id, "invalid_tokens"))
            return
        if len(job.prompt) >= self.n_ctx_slot:
            out.append(Failed.exceeds_context(job.id, len(job.prompt), self.n_ctx_slot))
            return
        if job.images or job.audio:
            problem = self._image_problem(job)
            if problem is not None:
                out.append(problem)
                return
        self._pending.append(job)
        self._admit(out)

    def _image_problem(self, job: Job) -> Failed | None:
        """The worker's own copy of the route's refusal: a job with images
        never degrades to text on a checkpoint without an image tower."""
        if job.audio:
            if self._audio is None:
                return Failed.coded(job.id, "no_audio_tower")
            if job.images or not self._audio.spans_ok(job.prompt, job.audio):
                return Failed.coded(job.id, "untokenizable")
            return None
        if self._vision is None:
            return Failed.coded(job.id, "no_image_tower")
        if not self._vision.spans_ok(job.prompt, job.images):
            return Failed.coded(job.id, "untokenizable")
        return None

    def cancel(self, job_id: int, out: list) -> None:
        seq = self._by_job.get(job_id)
        if seq is None:
            self._pending = deque(j for j in self._pending if j.id != job_id)
            return
        self._release(seq, out, cancelled=True)
        self._admit(out)

    def force_end(self, job_ids: tuple[int, ...]) -> None:
        """Realtime reasoning control: each running job's constraint closes
        its thinking block before the next draw.  A job still queued has no
        constraint yet and is left alone, as one that already ended is."""
        for job_id in job_ids:
            seq = self._by_job.get(job_id)
            if seq is not None and seq.row is not None and seq.row.constraint is not None:
                seq.row.constraint.force_end()

    def close(self, out: list) -> None:
        """Cancel everything and wait for in-flight MLX work: the process may
        exit right after, and MLX must not be mid-evaluation then."""
        import mlx.core as mx

        if self._cache is not None and self._cache.disk is not None:
            self._cache.disk.close()  # what the disk writer was handed reaches the disk
        self._cache = None  # nothing is worth donating on the way out
        for seq in list(self._by_job.values()):
            self._release(seq, out, cancelled=True)
        self._pending.clear()
        mx.synchronize(self._gen.stream)  # the generator computes on its own stream
        mx.synchronize()

    def clear_prompt_cache(self, out: list) -> None:
        if self._cache is not None:
            self._cache.clear()
            self._cache_stats(out)

    def _in_vocab(self, tokens) -> bool:
        n_vocab = self.vocab.n_vocab
        return all(0 <= t < n_vocab for t in tokens)

    def slot_action(self, cmd: SlotAction, out: list) -> None:
        """Read or replace a slot's retained tokens (slot save / restore /
        erase); a slot serving a job answers busy."""
        slot = cmd.id_slot
        if not 0 <= slot < self.n_slots:
            out.append(Failed.coded(cmd.job_id, "invalid_slot"))
            return
        if slot not in self._free:
            out.append(Failed.coded(cmd.job_id, "slot_busy", {"slot": slot}))
            return
        previous = len(self._slot_tokens[slot])
        if cmd.tokens is not None:
            if len(cmd.tokens) > self.n_ctx_slot:
                out.append(Failed.coded(cmd.job_id, "restore_too_long"))
                return
            if not self._in_vocab(cmd.tokens):
                out.append(Failed.coded(cmd.job_id, "restore_invalid_tokens"))
                return
            self._slot_tokens[slot] = tuple(cmd.tokens)
            self._slot_ns[slot] = cmd.cache_ns
        out.append(SlotTokens(cmd.job_id, slot, self._slot_tokens[slot], previous,
                              self._slot_ns[slot]))
        if cmd.tokens and cmd.cache_ns is not None and self._cache is not None:
            self._refill(slot, cmd.tokens, cmd.cache_ns, out)

    def _refill(self, slot: int, tokens: tuple[int, ...], ns: str, out: list) -> None:
        """Re-evaluate restored tokens on their slot so the prompt cache holds
        their KV again: the slot is busy meanwhile, and requests for it wait.
        A stream that filled its slot (a truncated generation saves exactly
        n_ctx_slot tokens) is re-evaluated minus its last token: admission
        needs room for the one token a refill draws, and no admissible prompt
        could adopt more than n_ctx_slot - 1 of it anyway."""
        self._refill_ids -= 1
        tokens = tokens[:self.n_ctx_slot - 1]
        job = Job(self._refill_ids, tokens, n_predict=1, ignore_eos=True, id_slot=slot,
                  sampling=GREEDY_PARAMS, cache_ns=ns)
        self._pending.appendleft(job)
        self._admit(out)

    def _exceeded(self, out: list) -> None:
        """The unified budget cannot take the next step's tokens: as
        upstream, every admitted job fails with a server error and its slot
        is freed and cleared (its KV is not worth keeping); then the
        waiting jobs get the room."""
        log.error("Context size has been exceeded. n_ctx = %d, held = %d by %d sequences",
                  self._budget.n_ctx, self.n_held, len(self._by_job))
        for seq in list(self._by_job.values()):
            out.append(Failed.coded(seq.job.id, CONTEXT_EXCEEDED))
            self._release(seq, out, cancelled=False, donate=False)
            self._slot_tokens[seq.slot], self._slot_ns[seq.slot] = (), None
        self._admit(out)

    def fail_all(self, out: list, message: str) -> None:
        """After a failed step or command: every admitted job fails with a
        server error and the generator starts over empty; queued jobs are
        kept and admitted.  It never raises: it runs in the engine loop's
        failure handlers, where an exception would end the engine thread
        and leave every request waiting.  A queued job whose start raises
        here is answered by `_admit` and the round repeats; each round
        takes one job off the queue, so it ends."""
        while True:
            for seq in list(self._by_job.values()):
                out.append(Failed(seq.job.id, "server_error", message))
                seq.uid = None  # the old generator is dropped whole below
                self._release(seq, out, cancelled=False)
            self._by_uid.clear()
            self._gen = self._new_generator()
            try:
                self._admit(out)
                return
            except Exception as exc:
                log.exception("starting a queued job failed")
                message = f"{type(exc).__name__}: {exc}"

    # -- the step --------------------------------------------------------------

    def step(self, out: list) -> None:
        """One prefill chunk and/or one decode step for everything admitted."""
        if not self._by_job:
            return
        if self._budget is not None and self._budget.overflows(self.n_held):
            self._exceeded(out)
            return
        if self._held and not self._decoding():
            while self._held:
                self._insert(self._held.popleft())
        if not self._by_uid:
            return
        self._batch.reset()
        n_free = len(self._free)
        prompt_resps, gen_resps = self._gen.next()
        now = time.perf_counter()
        finished: list = []
        snapshots: list[_Sequence] = []
        for r in prompt_resps:
            seq = self._by_uid.get(r.uid)
            if seq is None:
                continue
            if seq.job.return_progress and seq.t_first is None:
                self._progress(seq, r.progress[0], now, out)
            if r.end_of_segment and not r.end_of_prompt and self._snapshots:
                snapshots.append(seq)
            if r.end_of_prompt:
                seq.prefilled = True
                self._maybe_shift(seq, now, out, finished)
        for r in gen_resps:
            seq = self._by_uid.get(r.uid)
            if seq is None or seq.done:
                continue
            seq.kv.append(r.token)
            self._on_token(seq, r.token, now, out)
            if seq.done:
                finished.append((seq, r))
            else:
                self._maybe_shift(seq, now, out, finished)
        if snapshots:
            self._snapshot(snapshots, out)
        for seq, r in finished:
            # mlx-lm drops a sequence at its max_tokens itself, handing its
            # KV over on the response
            held = (r.prompt_cache, r.all_tokens) if r and r.finish_reason is not None else None
            self._finish(seq, now, out, held)
        if len(self._free) > n_free:
            self._admit(out)

    # -- internals -------------------------------------------------------------

    @property
    def n_held(self) -> int:
        """Tokens the admitted sequences hold (prompt + generated each)."""
        return total_held(len(seq.kv) for seq in self._by_job.values())

    def _admit(self, out: list) -> None:
        """Move waiting jobs into free slots (FIFO, honoring id_slot; under
        unified KV the first job that does not fit the budget waits, and
        every job behind it)."""
        waiting: deque[Job] = deque()
        try:
            while self._pending and self._free:
                job = self._pending.popleft()
                if job.id_slot == -1:
                    slot = self._free[0]
                elif job.id_slot in self._free:
                    slot = job.id_slot
                else:
                    waiting.append(job)
                    continue
                if self._budget is not None and not self._budget.admits(
                        self.n_held, len(job.prompt) + len(job.replay)):
                    self._pending.appendleft(job)  # first in line for the room
                    break
                self._free.remove(slot)
                try:
                    self._start(job, slot, out)
                except BaseException as exc:
                    # the engine loop fails the jobs it knows about (fail_all:
                    # the registered ones); one that raised before it was
                    # registered is in no table any more, so its slot goes
                    # back and its waiter is answered here, or never
                    if job.id not in self._by_job:
                        self._free.append(slot)
                        self._free.sort()
                        out.append(Failed(job.id, "server_error",
                                          f"{type(exc).__name__}: {exc}"))
                    raise
        finally:
            # jobs skipped for a pinned slot stay queued even if a start failed
            waiting.extend(self._pending)
            self._pending = waiting

    def _start(self, job: Job, slot: int, out: list) -> None:
        n_prompt = len(job.prompt)
        room = self.n_ctx_slot - n_prompt
        # n_predict 0 still yields one token, as upstream does.  With context
        # shift on, only n_predict bounds a generation.
        shift = self.context_shift and not _has_media(job)
        want = (UNBOUNDED if shift else room) if job.n_predict < 0 else max(1, job.n_predict)
        seq = _Sequence(job, slot, self.vocab, want if shift else min(want, room),
                        self.n_adapters)
        self._by_job[job.id] = seq
        n_cache, caches = 0, None
        if self._cache is not None and seq.ns is not None and n_prompt > 1:
            # as upstream, no chunk reuse for a prompt with images or audio
            reuse = 0 if _has_media(job) else job.n_cache_reuse
            log.debug("updating prompt cache")  # upstream's words for this load
            n_cache, caches = self._cache.lookup(seq.ns, job.prompt, reuse, self._shifter)
            seq.n_cache, seq.cached, seq.n_kv0 = n_cache, caches, n_cache
            seq.cache_tier = self._cache.last_tier
            self._cache_stats(out)
        if _has_media(job) and n_prompt > 1 and n_cache < self._media_end(job):
            # the cached prefix (same pictures, by the namespace) stops short
            # of an image's features: encode and prefill the whole prompt
            n_cache = seq.n_cache = 0
            seq.cache_tier = "none"
            seq.cached, seq.n_kv0 = self._image_prefill(seq), n_prompt - 1
        out.append(Started(job.id, slot, n_prompt, n_cache))
        if self._clear_idle and job.id > 0:
            self._clear_idle_slots()
        if job.return_progress:
            self._progress(seq, 0, seq.t_start, out)
        if n_prompt == 0:
            # Upstream answers an empty prompt with an empty final result.
            seq.done = True
            self._finish(seq, time.perf_counter(), out)
            return
        seq.sampler, seq.processors, seq.row = self._sampling_plan(job)
        if job.replay:
            self._replay(seq, out)
            if seq.done:
                self._finish(seq, time.perf_counter(), out)
                return
        if not self.cont_batching and self._decoding():
            self._held.append(seq)
            return
        self._insert(seq)

    def _clear_idle_slots(self) -> None:
        """Upstream's idle-slot save on a task's start: an idle slot's KV is
        already in the prompt cache (donated when its job ended), so under
        unified KV what remains is to forget the tokens it retained."""
        for slot in self._free:
            if self._slot_tokens[slot]:
                log.debug("slot %d | idle slot left to the prompt cache and cleared "
                          "(%d tokens) __TEST_TAG_CACHE_IDLE_SLOT__", slot,
                          len(self._slot_tokens[slot]))
                self._slot_tokens[slot], self._slot_ns[slot] = (), None

    def _replay(self, seq: _Sequence, out: list) -> None:
        """A continued generation: the tokens already published go through
        the stop matcher, detokenizer and counters as if drawn (the server
        drops their frames), join the KV the prefill builds (the grammar and
        the penalties read them from there), and the seeded stream skips
        their draws, so the next draw is the one the first process made."""
        now = time.perf_counter()
        for token in seq.job.replay:
            seq.kv.append(token)
            self._on_token(seq, token, now, out)
            if seq.done:
                return
        row = seq.row
        if row is not None and row.draws:
            row.rng_restore(row.rng_state(), len(seq.job.replay))

    def _image_prefill(self, seq: _Sequence) -> list:
        """Run the tower over the job's images and prefill its prompt (all but
        the last token) with their features into a fresh cache."""
        t0 = time.perf_counter()
        layers = self._new_caches.layers()
        caches = [*layers, AdapterRows([seq.scales])] if self.n_adapters else layers
        tower, media = ((self._audio, seq.job.audio) if seq.job.audio
                        else (self._vision, seq.job.images))
        tower.prefill(self._model, seq.job.prompt, media, caches, self._batch_size)
        log.debug("job %d: %d media item(s) encoded and %d prompt tokens prefilled in %.1f ms",
                  seq.job.id, len(seq.job.images) + len(seq.job.audio), len(seq.job.prompt) - 1,
                  _ms_since(t0, time.perf_counter()))
        return layers

    def _media_end(self, job: Job) -> int:
        """The prompt position just past the job's last image or clip."""
        if job.audio:
            return job.audio[-1].start + self._audio.span(job.audio[-1])
        return job.images[-1].start + self._vision.span(job.images[-1])

    def _decoding(self) -> bool:
        """Whether an admitted sequence has reached decoding (-nocb's gate)."""
        return any(s.prefilled or s.t_first is not None for s in self._by_uid.values())

    def _insert(self, seq: _Sequence, processors: list | None = None) -> None:
        """Hand the sequence's KV tokens to the generator as its prompt (the
        first time after the prompt cache's prefix, if it supplied one)."""
        if seq.t_first is None and not _has_media(seq.job):  # an image's encode counts
            seq.t_start = time.perf_counter()
        gen_max = seq.max_tokens if self._bounded(seq) else UNBOUNDED
        caches, seq.cached = seq.cached, None
        n = seq.n_kv0 if caches else 0
        fresh = None if caches else self._new_caches()
        if self.n_adapters:
            # the scales ride at the end of the cache list (lora.py)
            layers = caches or fresh or make_prompt_cache(self._model)
            caches = fresh = [*layers, AdapterRows([seq.scales])]
        rest = list(seq.kv[n:])
        cuts = reuse_points(seq.kv, n, self._message_ends) if self._snapshots else ()
        (uid,) = self._gen.insert_segments(
            [_segments(rest, [c - n for c in cuts])], max_tokens=[gen_max],
            caches=[caches or fresh] if caches or fresh else None,
            all_tokens=[list(seq.kv[:n])] if caches else None,
            samplers=[seq.sampler],
            logits_processors=[seq.processors if processors is None else processors])
        seq.uid = uid
        seq.prefilled = False
        self._by_uid[uid] = seq
        if self._drafter is not None and seq.job.speculative is not None and speculates(seq.row):
            spec = seq.job.speculative
            plan = seq.plan
            seq.plan = Plan(spec.n_max, spec.n_min, spec.p_min, ctx_limit=self.n_ctx_slot,
                            row=seq.row, banned=self._banned if seq.job.ignore_eos else ())
            if plan is not None:  # re-inserted after a context shift: counts carry on
                seq.plan.draft_n, seq.plan.accepted, seq.plan.rounds = (
                    plan.draft_n, plan.accepted, plan.rounds)
            self._gen._generation_batch.plans[uid] = seq.plan

    def _bounded(self, seq: _Sequence) -> bool:
        """Whether the slot's context bounds this sequence: always without
        context shift, and always for a job with images, whose features a
        shifted re-prefill from token ids would lose (upstream disables
        context shift for multimodal too)."""
        return not self.context_shift or _has_media(seq.job)

    def _drop_uid(self, uid: int) -> None:
        """The generator forgets a sequence (and so does the drafter)."""
        self._gen.remove([uid])
        if self._drafter is not None:
            self._gen._generation_batch.plans.pop(uid, None)
            self._drafter.forget(uid)

    def _maybe_shift(self, seq: _Sequence, now: float, out: list, finished: list) -> None:
        """Upstream's pre_decode: before the sampled token is decoded into
        the slot's last cell, process it, then shift the window."""
        if self._bounded(seq) or len(seq.kv) + 1 < self.n_ctx_slot:
            return
        token = context_shift.pending_token(self._gen, seq.uid)
        if token is None:
            return
        self._on_token(seq, token, now, out)
        if seq.done:
            finished.append((seq, None))
            return
        job = seq.job
        if job.shared_prompt:
            # upstream refuses to shift a parent/child task of n_cmpl > 1
            out.append(Failed.coded(job.id, "shift_shared_prompt"))
            self._release(seq, out, cancelled=False)
            return
        n_keep, n_discard = context_shift.window(
            len(seq.kv), self.n_ctx_slot, job.n_keep, job.n_discard, len(job.prompt),
            self._add_bos)
        log.warning("slot %d | task %d | slot context shift, n_keep = %d, n_left = %d, "
                    "n_discard = %d", seq.slot, job.id, n_keep, len(seq.kv) - n_keep, n_discard)
        self._drop_uid(seq.uid)
        del self._by_uid[seq.uid]
        seq.kv = [*context_shift.retained(seq.kv, n_keep, n_discard), token]
        seq.truncated = True
        seq.n_shifts += 1
        self._insert(seq, context_shift.history_processors(
            seq.processors, [*job.prompt, *seq.tokens], len(seq.kv)))

    def _sampling_plan(self, job: Job):
        params = job.sampling
        breakers = (breakers_for(self.vocab, params.dry_sequence_breakers)
                    if dry_on(params) else None)
        constraint = job.grammar.start(len(job.prompt)) if job.grammar is not None else None
        if job.ignore_eos:
            # upstream's logit_bias_eog: every end-of-generation token banned;
            # a greedy job with nothing else to process bans them in its
            # (shared, batched) sampler rather than through a processor
            plain = plan(params, self.vocab.n_vocab, self._batch, breakers=breakers,
                         constraint=constraint)
            if plain[0] is GREEDY and not plain[1]:
                return (self._greedy_no_eos, *plain[1:])
            params = attrs.evolve(params, logit_bias=params.logit_bias + self._eos_bias)
        return plan(params, self.vocab.n_vocab, self._batch, breakers=breakers,
                    constraint=constraint)

    def _progress(self, seq: _Sequence, processed: int, now: float, out: list) -> None:
        processed += seq.n_cache  # cache-supplied tokens count as processed
        if processed == seq.processed:
            return
        seq.processed = processed
        out.append(PromptProgress(seq.job.id, len(seq.job.prompt), seq.n_cache, processed,
                                  _ms_since(seq.t_start, now)))

    def _on_token(self, seq: _Sequence, token: int, now: float, out: list) -> None:
        """Upstream's process_token: stop word, n_predict, indent, time,
        context bound, then EOS (a later check overrides the stop type)."""
        job = seq.job
        decided = now if self._clock is None else self._clock()
        if seq.t_first is None:
            seq.t_first = now
            seq.t_first_decided = decided
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
        if self._bounded(seq) and len(job.prompt) + n >= self.n_ctx_slot:
            # the slot's context is full: upstream checks this after the stop
            # words, so it overrides a word stop's type
            seq.truncated, seq.stop_type, seq.done = True, "limit", True
        elif not seq.done and n >= seq.max_tokens:
            seq.stop_type, seq.done = "limit", True
        if job.n_indent > 0:
            self._check_indent(seq)
        if (not seq.done and job.t_max_predict_ms > 0 and "\n" in emit
                and _ms_since(seq.t_first_decided, decided) > job.t_max_predict_ms):
            seq.stop_type, seq.done = "limit", True
        if is_eos:
            seq.stop_type, seq.done = "eos", True
        if seq.done and not seq.stops.stopped:
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

    def _finish(self, seq: _Sequence, now: float, out: list, held=None) -> None:
        timings = seq.timings(now)
        out.append(Finished(
            job_id=seq.job.id, id_slot=seq.slot, content="".join(seq.content),
            tokens=tuple(seq.tokens), stop_type=seq.stop_type,
            stopping_word=seq.stopping_word, truncated=seq.truncated,
            n_prompt=len(seq.job.prompt), timings=timings, probs=tuple(seq.probs),
        ))
        if seq.job.id > 0:  # upstream's print_timings, once per client task, on one line
            _log_task(seq.slot, seq.job.id, timings, seq.stop_type, seq.truncated,
                      seq.cache_tier)
        self._release(seq, out, cancelled=False, held=held)

    def _release(self, seq: _Sequence, out: list, cancelled: bool, held=None,
                 donate: bool = True) -> None:
        seq.done = True
        if seq in self._held:
            self._held.remove(seq)
        if seq.job.id > 0:  # a refill leaves the restored stream alone, as warmup leaves none
            # after a context shift the slot holds the shifted window, as upstream's
            self._slot_tokens[seq.slot] = (tuple(seq.kv) if seq.n_shifts
                                           else seq.job.prompt + tuple(seq.tokens))
            self._slot_ns[seq.slot] = seq.job.cache_ns
        if seq.uid is not None:
            donate = donate and self._cache is not None and seq.ns is not None
            if donate and held is None:
                try:
                    held = self._gen.extract_cache([seq.uid]).get(seq.uid)
                except Exception:  # e.g. a prompt batch with no KV written yet
                    log.debug("job %s: no KV to donate", seq.job.id, exc_info=True)
            self._drop_uid(seq.uid)
            if donate and held is not None and held[0]:
                self._donate(seq.ns, held, out)
            del self._by_uid[seq.uid]
        del self._by_job[seq.job.id]
        self._free.append(seq.slot)
        self._free.sort()
        out.append(SlotFreed(seq.slot, seq.job.id, cancelled))

    def _snapshot(self, seqs: list[_Sequence], out: list) -> None:
        """Store the state each sequence's prompt reached at a reuse point
        (it is still in the prompt batch: the segment was just prefilled)."""
        if self._cache is None:
            return
        held = self._gen.extract_cache([s.uid for s in seqs if s.ns is not None])
        for seq in seqs:
            if seq.uid in held and seq.ns is not None:
                layers, tokens = held[seq.uid]
                # the generator keeps extending this list: copy it now
                self._donate(seq.ns, (layers, list(tokens)), out)

    def _donate(self, ns: str, held, out: list) -> None:
        layers, tokens = held
        layers, _ = split_rows(layers)
        lengths = cache_kinds.lengths(layers)
        n = max(lengths) if lengths else len(tokens)
        if len(tokens) < n or len(lengths) > 1:
            return  # the token record does not cover the KV: nothing trustworthy
        if self._cache.donate(ns, tokens[:n], layers):
            self._cache_stats(out)

    def _cache_stats(self, out: list) -> None:
        out.append(CacheStats(**self._cache.stats()))   # the same names, one for one


def _has_media(job: Job) -> bool:
    """Whether the job carries images or audio clips (their features are
    placed at admission, never recomputed from token ids)."""
    return bool(job.images or job.audio)


def speculates(row) -> bool:
    """Whether a row's draws can be verified several at a time: its sampler
    state must not evolve per draw (mirostat, adaptive-p), and a grammar or
    a probability report ties it to one token per step."""
    if row is None:
        return True
    p = row.params
    return (p.mirostat == 0 and p.n_probs <= 0 and row.constraint is None
            and not ("adaptive_p" in p.samplers and p.adaptive_target >= 0.0))


def _rate(n: int, ms: float) -> str:
    return f"{1e3 * n / ms:.2f} t/s" if ms > 0 else "- t/s"


def reuse_points(tokens, start: int, message_ends: frozenset[int]) -> list[int]:
    """Where a prompt's prefill stops for a snapshot: after each message's
    end token, every SNAPSHOT_EVERY tokens and at the prompt's end (minus
    the token the first decode step feeds), all past `start` (what a cached
    prefix already supplied)."""
    end = len(tokens) - 1
    points = {i + 1 for i in range(start, end) if tokens[i] in message_ends}
    points.update(range(start + SNAPSHOT_EVERY, end, SNAPSHOT_EVERY))
    points.add(end)
    return sorted(p for p in points if start < p <= end)


def _segments(rest: list[int], cuts: list[int]) -> list[list[int]]:
    """`rest` split at the (relative, increasing) positions in `cuts`."""
    out, prev = [], 0
    for c in cuts:
        if c > prev:
            out.append(rest[prev:c])
            prev = c
    if prev < len(rest):
        out.append(rest[prev:])
    return out


def _log_task(slot: int, task: int, t: Timings, stop: str, truncated: bool,
              tier: str = "none") -> None:
    """The facts upstream prints when a task ends: prompt and generated
    tokens with their time and rate, the slot, and why it stopped; which
    tier of the prompt cache supplied the cached tokens (memory, disk,
    none) is ours."""
    log.info("slot %d | task %d | prompt %d tokens (%d cached, cache %s) in %.2f ms, %s | "
             "generated %d tokens in %.2f ms, %s | total %.2f ms | stop: %s%s",
             slot, task, t.prompt_n, t.cache_n, tier, t.prompt_ms,
             _rate(t.prompt_n, t.prompt_ms),
             t.predicted_n, t.predicted_ms, _rate(t.predicted_n, t.predicted_ms),
             t.prompt_ms + t.predicted_ms, stop, " (truncated)" if truncated else "")

"""What the server knows about its slots and its work, read off engine events.

Theory of operation: the bridge hands every engine event to `Monitor.observe`
(on the trio thread, inside the same hop that delivers it to its request), and
/slots and /metrics render from the state kept here.  Nothing here asks the
engine anything or adds work to its loop: the slot registry follows
Started / PromptProgress / TokenPiece / Finished / SlotFreed, and the
`llamacpp:` counters are fed once per job from the timings those events
already carry (the prompt when the first token arrives, the generation when
the slot frees).  The two per-step counters upstream keeps (decode calls and
busy slots per call) are the engine loop's; each step that computed closes
its events with an `EngineStats` carrying their totals, and the copy kept
here is what /metrics reads (see engine/loop.py).  MLX's allocator figures
arrive the same way, as the latest `MlxMemory` the engine thread read.

Upstream's semantics kept here:
- a slot is the engine's own slot (the lowest free one at admission), held
  from `Started` until `SlotFreed`; an idle slot still reports its last job
  (upstream's task_prev), with is_processing false;
- throughput gauges are rates over the window since the previous scrape
  (`take_buckets` resets them), the counters are cumulative since start;
- generation rates count decode steps, not tokens: the first token of a job
  comes from the prompt's logits and is free.

The engine's internal jobs (negative ids: a slot restore's refill) hold a
slot, so it shows busy, but they are no request: they keep the slot's last
task and count nowhere.  Nor does a failed slot action.

Nothing here imports trio or MLX.
"""

from __future__ import annotations

import contextvars
import os
import re
import time

import attrs

from .protocol.records import (
    Embedded,
    EngineStats,
    Failed,
    Finished,
    Job,
    MlxMemory,
    PromptProgress,
    Sleeping,
    SlotFreed,
    Started,
    Timings,
    TokenPiece,
    Woke,
)

SLOTS_DEBUG_ENV = "LLAMA_SERVER_SLOTS_DEBUG"


def slots_debug() -> bool:
    """upstream's gate: atoi(LLAMA_SERVER_SLOTS_DEBUG) != 0."""
    m = re.match(r"\s*[+-]?\d+", os.environ.get(SLOTS_DEBUG_ENV, ""))
    return m is not None and int(m.group()) != 0


@attrs.define
class SlotView:
    """One slot as /slots reports it."""

    id: int
    job_id: int | None = None     # the current job, else the last one (None: never used)
    job: Job | None = None        # its record (None if it was cancelled before admission)
    processing: bool = False
    n_prompt: int = 0
    n_cache: int = 0
    n_processed: int = 0
    n_decoded: int = 0
    has_new_line: bool = False
    timings: Timings | None = None
    pieces: list[str] | None = None   # generated text; kept only when slots_debug()

    @property
    def n_remain(self) -> int:
        """-1 when limitless, and on an idle slot (upstream resets the budget
        on release)."""
        n_predict = self.job.n_predict if self.job is not None and self.processing else -1
        return -1 if n_predict < 0 else n_predict - self.n_decoded


@attrs.define
class Bucket:
    """Tokens, the decode steps that produced them, and the time they took."""

    count: int = 0
    steps: int = 0
    seconds: float = 0.0

    def add(self, count: int, steps: int, seconds: float) -> None:
        self.count += count
        self.steps += steps
        self.seconds += seconds

    def rate(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0


@attrs.define
class Counters:
    """upstream's server_metrics."""

    t_start: float = attrs.field(factory=time.time)
    prompt: Bucket = attrs.field(factory=Bucket)
    predict: Bucket = attrs.field(factory=Bucket)
    prompt_window: Bucket = attrs.field(factory=Bucket)    # since the last scrape
    predict_window: Bucket = attrs.field(factory=Bucket)
    n_prompt_cached: int = 0
    n_tokens_max: int = 0
    # the engine loop's totals, as its latest EngineStats reported them
    n_decode: int = 0
    n_busy_slots: int = 0
    # speculative decoding: drafted tokens, accepted ones, verify steps
    n_draft: int = 0
    n_draft_accepted: int = 0
    n_draft_rounds: int = 0
    # ours (mlxcel_ families)
    finished: int = 0
    failed: int = 0
    cancelled: int = 0
    sleeps: int = 0
    wakes: int = 0
    wake_seconds: float = 0.0
    released_bytes: int = 0
    # embedding / rerank inputs computed, and their tokens
    embedded: int = 0
    embedded_tokens: int = 0
    # MLX's allocator (bytes) and the engine's memory releases
    memory: MlxMemory | None = None   # the latest, the release totals with them


# The request a job is submitted from (server/http/watchdog.py sets it for the
# request's task): `submitted` appends the job id to its `job_ids`.
REQUEST: contextvars.ContextVar = contextvars.ContextVar("mlxcel_request", default=None)


class Monitor:
    def __init__(self, n_slots: int) -> None:
        self.slots = [SlotView(i) for i in range(n_slots)]
        self.counters = Counters()
        self.sleeping = False
        # the counters as they stood when the engine fell asleep: /metrics
        # answers our families from them while asleep, as upstream serves its
        # metrics from the snapshot taken on entering sleep
        self.before_sleep: Counters | None = None
        self.debug = slots_debug()
        self._slot_of: dict[int, SlotView] = {}
        self._internal: dict[int, SlotView] = {}   # internal jobs' slots
        self.queued: dict[int, Job] = {}   # submitted, not admitted yet (requests_deferred)

    # -- from the bridge -------------------------------------------------------------

    def submitted(self, job: Job) -> None:
        self.queued[job.id] = job
        request = REQUEST.get()
        if request is not None:
            request.job_ids.append(job.id)

    def job_progress(self, job_id: int) -> tuple:
        """What changes while a job moves: queued, then its slot's prompt and
        decode counts (read by the request watchdog, once per tick)."""
        view = self._slot_of.get(job_id)
        if view is None:
            return (job_id in self.queued,)
        return view.n_processed, view.n_decoded

    def dropped(self, job_id: int) -> None:
        """The request let go of a job (ended or cancelled)."""
        self.queued.pop(job_id, None)

    def observe(self, ev) -> None:
        if isinstance(ev, TokenPiece):  # the hot one first
            view = self._slot_of.get(ev.job_id)
            if view is None:
                return
            view.n_decoded = ev.n_decoded
            view.timings = ev.timings
            if ev.n_decoded == 1:
                self._prompt_done(view, ev.timings)
            if not view.has_new_line and "\n" in ev.text:
                view.has_new_line = True
            if view.pieces is not None:
                view.pieces.append(ev.text)
        elif isinstance(ev, EngineStats):  # once per computing step
            self.counters.n_decode, self.counters.n_busy_slots = ev.n_decode, ev.n_busy_slots
        elif isinstance(ev, MlxMemory):  # at most once a second, and on going idle
            self.counters.memory = ev
        elif isinstance(ev, Started):
            self._started(ev)
        elif isinstance(ev, PromptProgress):
            view = self._slot_of.get(ev.job_id)
            if view is not None:
                view.n_processed = ev.processed
        elif isinstance(ev, Finished):
            view = self._slot_of.get(ev.job_id)
            if view is not None:
                view.timings = ev.timings
                self.counters.finished += 1
        elif isinstance(ev, SlotFreed):
            self._freed(ev)
        elif isinstance(ev, Failed):
            # a generation job is queued or holds a slot
            if self.queued.pop(ev.job_id, None) is not None or ev.job_id in self._slot_of:
                self.counters.failed += 1
        elif isinstance(ev, Embedded):
            self.counters.embedded += 1
            self.counters.embedded_tokens += ev.n_tokens
        elif isinstance(ev, Sleeping):
            self.before_sleep = attrs.evolve(self.counters)
            self.sleeping = True
            self.counters.sleeps += 1
            self.counters.released_bytes = ev.released_bytes
        elif isinstance(ev, Woke):
            self.sleeping = False
            self.counters.wakes += 1
            self.counters.wake_seconds += ev.load_ms / 1e3

    # -- readers ---------------------------------------------------------------------

    @property
    def n_processing(self) -> int:
        return sum(1 for s in self.slots if s.processing)

    @property
    def n_idle(self) -> int:
        return len(self.slots) - self.n_processing

    def n_tokens_max(self) -> int:
        live = max((s.n_prompt + s.n_decoded for s in self.slots if s.processing), default=0)
        return max(self.counters.n_tokens_max, live)

    def take_windows(self) -> tuple[float, float]:
        """The prompt and generation rates since the previous call (upstream
        resets its buckets on every scrape)."""
        c = self.counters
        rates = c.prompt_window.rate(), c.predict_window.rate()
        c.prompt_window, c.predict_window = Bucket(), Bucket()
        return rates

    # -- internals -------------------------------------------------------------------

    def _started(self, ev: Started) -> None:
        view = self.slots[ev.id_slot]
        if ev.job_id < 0:
            view.processing = True
            self._internal[ev.job_id] = view
            return
        view.job_id, view.job = ev.job_id, self.queued.pop(ev.job_id, None)
        view.processing = True
        view.n_prompt, view.n_cache = ev.n_prompt, ev.n_cache
        view.n_processed = view.n_decoded = 0
        view.has_new_line = False
        view.timings = None
        view.pieces = [] if self.debug else None
        self._slot_of[ev.job_id] = view

    def _prompt_done(self, view: SlotView, t: Timings) -> None:
        view.n_processed = t.prompt_n
        c = self.counters
        c.prompt.add(t.prompt_n, t.prompt_n, t.prompt_ms / 1e3)
        c.prompt_window.add(t.prompt_n, t.prompt_n, t.prompt_ms / 1e3)
        c.n_prompt_cached += t.cache_n

    def _freed(self, ev: SlotFreed) -> None:
        internal = self._internal.pop(ev.job_id, None)
        if internal is not None:
            internal.processing = False
            return
        view = self._slot_of.pop(ev.job_id, None)
        if view is None:
            return
        view.processing = False
        c = self.counters
        if ev.cancelled:
            c.cancelled += 1
        t = view.timings
        if t is not None and t.predicted_n > 0:
            n = t.predicted_n
            c.predict.add(n, n - 1, t.predicted_ms / 1e3)
            c.predict_window.add(n, n - 1, t.predicted_ms / 1e3)
        if t is not None:
            c.n_draft += t.draft_n
            c.n_draft_accepted += t.draft_n_accepted
            c.n_draft_rounds += t.draft_rounds
        c.n_tokens_max = max(c.n_tokens_max, view.n_prompt + view.n_decoded)
        # upstream's slot reset on release: the idle slot keeps its last task but
        # not that task's counters (its stats, the new-line flag)
        view.n_processed = view.n_cache = view.n_decoded = 0
        view.has_new_line = False

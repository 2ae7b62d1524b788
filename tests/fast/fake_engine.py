"""A scripted stand-in for engine/loop.py's `EngineLoop`: no model, no MLX.

It satisfies `bridge.Engine` and runs where the real engine runs, on the
bridge's engine thread: `run` emits `Loaded` (or `LoadFailed`), then serves
commands until `Shutdown`.  Each submitted job gets a slot (the lowest free
one, or the one it names; it waits while none is free) and then plays its
*script*: an iterable of steps, each a tuple of events emitted together as
one `StepEvents`, so one step of every running job is one hop, as in the
real engine.  When a job's script runs out, the job frees its slot
(`SlotFreed`) in that same step.

Cancellation is honoured the real engine's way: commands are drained before
every step, so a `Cancel` drops the job before its next step and frees its
slot (`SlotFreed(cancelled=True)`).  A script step `HOLD` parks its job until
it is cancelled: a long generation that only a client's disconnect ends,
without the engine spinning meanwhile.

Slot actions (save / restore / erase) answer as the scheduler does: each
slot keeps the prompt and sampled tokens of its last job.

Every command the engine receives is also put on `commands`, a thread-safe
queue tests read with a bounded wait (`next_command`).  Nothing here
imports trio.
"""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from mlxcel_trio.protocol.records import (
    Cancel,
    ClearPromptCache,
    EmbedderInfo,
    EmbedJob,
    Embedded,
    Failed,
    ForceEnd,
    Finished,
    Job,
    Loaded,
    LoadFailed,
    ModelInfo,
    PromptProgress,
    Shutdown,
    SlotAction,
    SlotFreed,
    SlotTokens,
    Started,
    StepEvents,
    Submit,
    Timings,
    TokenPiece,
)

HOLD = object()   # a script step: park the job until it is cancelled
# (job, its slot, the vocabulary or None) -> the job's steps, each a tuple of
# events emitted together, or HOLD
Script = Callable[[Job, int, object], Iterable]
COMMAND_WAIT_S = 10.0


def timings(n_prompt: int, n_decoded: int) -> Timings:
    """Deterministic timings: 1 ms per prompt token, 2 ms per token drawn."""
    return Timings(cache_n=0, prompt_n=n_prompt, prompt_ms=float(n_prompt),
                   predicted_n=n_decoded, predicted_ms=2.0 * n_decoded)


def _encode(text: str, vocab) -> list[int]:
    # without a vocabulary, one "token" per character (its code point)
    return vocab.tokenize(text) if vocab is not None else [ord(c) for c in text]


def _decode(ids: list[int], vocab) -> str:
    return vocab.detokenize(ids) if vocab is not None else "".join(map(chr, ids))


def reply(text: str = "Hello from the fake engine.", *, hold_after: int | None = None,
          stop_type: str = "eos", n_cache: int = 0) -> Script:
    """A script that generates `text`, one token per step, cut to the job's
    n_predict (then stop_type "limit").  With `hold_after`, the job parks
    after that many tokens until it is cancelled."""

    def script(job: Job, slot: int, vocab) -> Iterator:
        ids = _encode(text, vocab)
        limit = len(ids) if job.n_predict < 0 else min(job.n_predict, len(ids))
        kind = stop_type if limit == len(ids) else "limit"
        n_prompt = len(job.prompt)
        first: tuple = (Started(job.id, slot, n_prompt, n_cache),)
        if job.return_progress:
            first += (PromptProgress(job.id, n_prompt, n_cache, n_prompt, float(n_prompt)),)
        if limit == 0:
            yield first + (Finished(job.id, slot, "", (), kind, "", False, n_prompt,
                                    timings(n_prompt, 0)),)
            return
        shown = ""
        for i in range(limit):
            if hold_after is not None and i == hold_after:
                yield HOLD
            now = _decode(ids[:i + 1], vocab)
            piece, shown = now[len(shown):], now
            last = i == limit - 1
            step = (TokenPiece(job.id, ids[i], piece, i + 1, True, last,
                               timings(n_prompt, i + 1)),)
            if last:
                step += (Finished(job.id, slot, shown, tuple(ids[:limit]), kind, "",
                                  False, n_prompt, timings(n_prompt, limit)),)
            yield first + step if i == 0 else step

    return script


def fail(kind: str = "server_error", message: str = "injected engine failure",
         extra: tuple[tuple[str, int], ...] = (), *, after: int = 0) -> Script:
    """A script that fails the job after `after` tokens of the default reply."""

    def script(job: Job, slot: int, vocab) -> Iterator:
        steps = reply()(job, slot, vocab) if after else iter(())
        for _, step in zip(range(after), steps):
            yield step
        yield (Failed(job.id, kind, message, extra),)

    return script


def model_info(path: str, *, n_slots: int, n_ctx: int, n_vocab: int) -> ModelInfo:
    """What a tiny qwen3 checkpoint would report."""
    return ModelInfo(path=path, model_type="qwen3", n_ctx=n_ctx, n_ctx_slot=n_ctx // n_slots,
                     n_ctx_train=131072, n_slots=n_slots, n_vocab=n_vocab, n_embd=64,
                     n_params=250_000, size_bytes=1_000_000, dtype="float32",
                     quantization=None)


def embedder_info(pooling: str, path: str = "/fake/encoder") -> EmbedderInfo:
    """What an encoder with this pooling would report."""
    return EmbedderInfo(path=path, architecture="BertModel", pooling=pooling,
                        n_embd=3, n_ctx_train=512, n_vocab=1000,
                        is_classifier=pooling == "rank")


def fake_vectors(job: EmbedJob) -> np.ndarray:
    """The fake encoder's answer: readable from the job alone.  Pooled:
    [[n_tokens, first id, normalize]]; none: one [position, id, 0] row per
    token; rank: [[sum of ids / 1000]] (distinct documents, distinct scores)."""
    if job.pooling == "rank":
        return np.array([[sum(job.tokens) / 1000.0]], np.float32)
    if job.pooling == "none":
        return np.array([[i, t, 0] for i, t in enumerate(job.tokens)], np.float32)
    return np.array([[len(job.tokens), job.tokens[0], job.normalize]], np.float32)


class _Running:
    __slots__ = ("held", "job", "slot", "steps", "tokens")

    def __init__(self, job: Job, slot: int, steps: Iterator) -> None:
        self.job, self.slot, self.steps = job, slot, steps
        self.held = False
        self.tokens: list[int] = []


class FakeEngine:
    """The bridge's `Engine`, playing `script` for every job."""

    def __init__(self, emit: Callable[[StepEvents], None], info: ModelInfo, *,
                 vocab=None, script: Script | None = None,
                 load_error: str | None = None) -> None:
        self._emit = emit
        self._info = info
        self._vocab = vocab
        self.script: Script = script or reply()   # read at each admission
        self._load_error = load_error
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.commands: queue.SimpleQueue = queue.SimpleQueue()   # every command, in order
        self.vocab = None   # published before Loaded, as the real engine does
        # engine-thread state
        self._free = list(range(info.n_slots))
        self._pending: deque[Job] = deque()
        self._running: dict[int, _Running] = {}
        self._slot_tokens: list[tuple[int, ...]] = [()] * info.n_slots
        self._slot_ns: list[str | None] = [None] * info.n_slots

    def post(self, command) -> None:
        """Thread-safe, never blocks."""
        self._inbox.put(command)

    def next_command(self, timeout: float = COMMAND_WAIT_S):
        """The next command the engine received (blocking; call it from a
        worker thread under trio).  Fails with a message after `timeout`."""
        try:
            return self.commands.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the fake engine received no command in {timeout} s") from None

    # -- thread body --------------------------------------------------------------

    def run(self) -> None:
        if self._load_error is not None:
            self._emit(StepEvents((LoadFailed(self._load_error),)))
            return
        self.vocab = self._vocab
        self.embed_vocab = self._vocab if self._info.embedder is not None else None
        self.rerank_vocab = self._vocab if self._info.reranker is not None else None
        self._emit(StepEvents((Loaded(self._info),)))
        while True:
            out: list = []
            block = not self._runnable()
            while True:
                try:
                    cmd = self._inbox.get(block=block)
                except queue.Empty:
                    break
                block = False
                self.commands.put(cmd)
                if isinstance(cmd, Shutdown):
                    for run in list(self._running.values()):
                        self._release(run, out, cancelled=True)
                    if out:
                        self._emit(StepEvents(tuple(out)))
                    return
                self._command(cmd, out)
            self._step(out)
            if out:
                self._emit(StepEvents(tuple(out)))

    def _runnable(self) -> bool:
        return any(not run.held for run in self._running.values())

    def _command(self, cmd, out: list) -> None:
        if isinstance(cmd, Submit) and isinstance(cmd.job, EmbedJob):
            job = cmd.job
            if any(not 0 <= t < 1000 for t in job.tokens):
                out.append(Failed.coded(job.id, "invalid_tokens"))
            else:
                out.append(Embedded(job.id, fake_vectors(job), len(job.tokens)))
        elif isinstance(cmd, Submit):
            job = cmd.job
            if not -1 <= job.id_slot < self._info.n_slots:
                out.append(Failed.coded(job.id, "invalid_slot"))
                return
            self._pending.append(job)
            self._admit()
        elif isinstance(cmd, Cancel):
            run = self._running.get(cmd.job_id)
            if run is None:
                self._pending = deque(j for j in self._pending if j.id != cmd.job_id)
            else:
                self._release(run, out, cancelled=True)
                self._admit()
        elif isinstance(cmd, SlotAction):
            self._slot_action(cmd, out)
        elif not isinstance(cmd, (ClearPromptCache, ForceEnd)):  # nothing to close here
            raise TypeError(f"the fake engine got an unknown command {cmd!r}")

    def _admit(self) -> None:
        for job in list(self._pending):
            want = job.id_slot
            slot = (want if want in self._free else None) if want >= 0 else (
                self._free[0] if self._free else None)
            if slot is None:
                continue
            self._pending.remove(job)
            self._free.remove(slot)
            steps = iter(self.script(job, slot, self._vocab))
            self._running[job.id] = _Running(job, slot, steps)

    def _step(self, out: list) -> None:
        active = [run for run in self._running.values() if not run.held]
        if not active:
            return
        for run in active:
            try:
                step = next(run.steps, None)
            except Exception as exc:  # a broken script fails its job, as a failed step would
                step = (Failed(run.job.id, "server_error", f"{type(exc).__name__}: {exc}"),)
            if step is HOLD:
                run.held = True
                continue
            if step is not None:
                out.extend(step)
                run.tokens += [ev.token for ev in step
                               if isinstance(ev, TokenPiece) and ev.job_id == run.job.id]
            if step is None or any(isinstance(ev, (Finished, Failed)) for ev in step):
                self._release(run, out, cancelled=False)
        self._admit()

    def _release(self, run: _Running, out: list, cancelled: bool) -> None:
        del self._running[run.job.id]
        self._slot_tokens[run.slot] = run.job.prompt + tuple(run.tokens)
        self._slot_ns[run.slot] = run.job.cache_ns
        self._free = sorted(self._free + [run.slot])
        out.append(SlotFreed(run.slot, run.job.id, cancelled))

    def _slot_action(self, cmd: SlotAction, out: list) -> None:
        slot = cmd.id_slot
        if not 0 <= slot < self._info.n_slots:
            out.append(Failed.coded(cmd.job_id, "invalid_slot"))
            return
        if slot not in self._free:
            out.append(Failed.coded(cmd.job_id, "slot_busy", {"slot": slot}))
            return
        previous = len(self._slot_tokens[slot])
        if cmd.tokens is not None:
            self._slot_tokens[slot] = tuple(cmd.tokens)
            self._slot_ns[slot] = cmd.cache_ns
        out.append(SlotTokens(cmd.job_id, slot, self._slot_tokens[slot], previous,
                              self._slot_ns[slot]))


BPE_VOCAB = 1536        # fixtures/tiny.py's: the same tokenizer as the e2e checkpoint
MAX_POSITIONS = 131072


def write_tokenizer_checkpoint(out: Path) -> Path:
    """A directory holding the tiny fixture's tokenizer files and a config,
    no weights: enough for `engine.vocab.Vocab` (0.3 s to train, no MLX;
    fixtures/tiny.py itself imports MLX, hence its two numbers here)."""
    from fixtures import checkpoint as C
    from fixtures import tokenizer as T

    out.mkdir(parents=True, exist_ok=True)
    tok = T.train(BPE_VOCAB)
    ids = C.write_tokenizer(out, tok, MAX_POSITIONS)
    C.write_json(out / "config.json", {
        "model_type": "qwen3", "vocab_size": tok.get_vocab_size(),
        "max_position_embeddings": MAX_POSITIONS, "eos_token_id": ids["<|im_end|>"]})
    return out

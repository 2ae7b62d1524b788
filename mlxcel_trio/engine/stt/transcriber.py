"""Transcription jobs on the MLX thread: a Whisper model and a queue of
`TranscribeJob`s, one clip at a time, a few tokens per `step`.

Theory of operation.  `submit` checks a job (a language the vocabulary
knows) and queues it, or answers `Failed` at once.  `step` works on the
oldest job: its first step cuts the clip into log-Mel windows (30 s, the
encoder's 2 * n_audio_ctx frames); each
window is encoded once, its prompt (<|startofprev|> and the request's
prompt, then <|startoftranscript|>, the language and <|transcribe|> on a
multilingual model, then <|notimestamps|>) is prefilled, and then tokens are
decoded one at a time against the decoder's cache, at most `TOKENS_PER_STEP`
per step, so a `Cancel` waits for at most that many forwards.  Each step
that produced text appends one `TranscriptPiece`; the job ends with
`Transcribed`, whose text is exactly the concatenation of its pieces.

Decoding is Whisper's: greedy at temperature 0 (else sampled at that
temperature), every special token suppressed except <|endoftext|>, which
is itself suppressed on the first token of a window together with the
blank, so a window's transcript is never empty; a window stops at
<|endoftext|>, after n_text_ctx // 2 tokens or at the end of the text
context, the whole job at
`max_tokens`.  Text is detokenized from the window's tokens so far and
released only up to a complete UTF-8 character; leading whitespace of the
transcript is dropped.  Nothing here imports trio.
"""

from __future__ import annotations

import collections
import json
import logging
from pathlib import Path

import numpy as np

from ...protocol.records import Failed, TranscribeJob, TranscriberInfo, Transcribed, \
    TranscriptPiece
from . import mel

log = logging.getLogger("mlxcel.engine")

TOKENS_PER_STEP = 1   # one delta per token, and a Cancel waits for one forward
MAX_SECONDS = 600     # the longest clip (media/audio.py refuses longer ones first)


def is_whisper(path: str | Path) -> bool:
    """Whether `path` is a Whisper checkpoint: config.json says model_type
    "whisper", or (an older MLX export) carries Whisper's dimensions."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and (config.get("model_type") == "whisper" or (
        "model_type" not in config and {"n_audio_ctx", "n_text_ctx", "n_mels"} <= set(config)))


def checkpoint_problem(path: str | Path) -> str | None:
    """Why the Whisper checkpoint at `path` cannot be served, or None; from
    its files alone, before anything loads."""
    from .whisper import WEIGHT_FILES, Dims, weight_file

    path = Path(path)
    try:
        Dims.from_config(json.loads((path / "config.json").read_text()))
    except (OSError, ValueError) as exc:
        return f"Whisper checkpoint: {exc}"
    if weight_file(path) is None:
        return f"Whisper checkpoint: no {' or '.join(WEIGHT_FILES)} in {path}"
    if not (path / "tokenizer.json").is_file():
        return ("Whisper checkpoint: no tokenizer.json beside the weights (mlx-community's "
                "*-asr exports carry one; copy it from the matching openai/whisper-* "
                "repository)")
    return None


class _Active:
    """The job being decoded and where it stands (engine thread only)."""

    def __init__(self, job: TranscribeJob, windows: list[np.ndarray]) -> None:
        self.job = job
        self.windows = windows
        self.window = -1          # index of the window being decoded
        self.features = None      # that window's encoder output
        self.cache = None         # the decoder's cache for that window
        self.logits = None        # the next token's logits
        self.tokens: list[int] = []   # text tokens of the current window
        self.n_prompt = 0         # the current window's prompt length
        self.done_text = ""       # the finished windows' text
        self.emitted = ""         # the text released so far
        self.n_tokens = 0
        self.first = True         # the window's first token is next (no blank, no end)


class Transcriber:
    """A Whisper model and its queue (engine thread only)."""

    def __init__(self, model, config: dict, path: Path) -> None:
        from tokenizers import Tokenizer

        self.model = model
        self.dims = model.dims
        self.path = path
        self.tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        vocab = self.tok.get_vocab(with_added_tokens=True)

        def special(name: str) -> int:
            tid = vocab.get(name)
            if tid is None or tid >= self.dims.n_vocab:
                raise ValueError(f"tokenizer.json has no {name} token within the model's "
                                 f"{self.dims.n_vocab} ids")
            return tid

        self.eot = special("<|endoftext|>")
        self.sot = special("<|startoftranscript|>")
        self.no_timestamps = special("<|notimestamps|>")
        self.sot_prev = vocab.get("<|startofprev|>")
        # Whisper's rule: the multilingual vocabularies are the large ones
        self.multilingual = bool(config.get("multilingual", self.dims.n_vocab >= 51865))
        self.transcribe = special("<|transcribe|>") if self.multilingual else None
        self.languages = {name[2:-2]: tid for name, tid in vocab.items()
                          if name.startswith("<|") and name.endswith("|>")
                          and 2 <= len(name) - 4 <= 3 and name[2:-2].isalpha()
                          and name[2:-2].islower() and tid > self.eot} \
            if self.multilingual else {}
        # every id past <|endoftext|> is a special token (Whisper's layout);
        # a window's first token may be neither the end nor a blank
        import mlx.core as mx

        suppress = np.zeros(self.dims.n_vocab, bool)
        suppress[self.eot + 1:] = True
        self._suppress = mx.array(suppress)
        suppress[self.eot] = True
        suppress[[t for t in self.tok.encode(" ", add_special_tokens=False).ids
                  if t < self.dims.n_vocab]] = True
        self._suppress_first = mx.array(suppress)
        self.sample_len = self.dims.n_text_ctx // 2
        self.window_frames = 2 * self.dims.n_audio_ctx
        window_samples = self.window_frames * mel.HOP_LENGTH
        self.max_windows = -(-MAX_SECONDS * mel.SAMPLE_RATE // window_samples)
        self.public = TranscriberInfo(
            path=str(path), architecture="whisper", n_mels=self.dims.n_mels,
            n_text_ctx=self.dims.n_text_ctx, max_tokens=self.max_windows * self.sample_len,
            languages=tuple(sorted(self.languages)))
        self._queue: collections.deque[TranscribeJob] = collections.deque()
        self._active: _Active | None = None

    @classmethod
    def load(cls, path: str | Path) -> "Transcriber":
        from .whisper import load

        path = Path(path)
        model, config = load(path)
        return cls(model, config, path)

    @property
    def pending(self) -> bool:
        return self._active is not None or bool(self._queue)

    # -- commands ------------------------------------------------------------------

    def submit(self, job: TranscribeJob, out: list) -> None:
        if job.language and self.multilingual and job.language not in self.languages:
            out.append(Failed.coded(job.id, "unknown_language", {"language": job.language}))
        elif len(job.samples) > MAX_SECONDS * mel.SAMPLE_RATE:
            out.append(Failed.coded(job.id, "audio_too_long", {"max_seconds": MAX_SECONDS}))
        else:
            self._queue.append(job)

    def cancel(self, job_id: int) -> bool:
        if self._active is not None and self._active.job.id == job_id:
            self._active = None
            return True
        for job in self._queue:
            if job.id == job_id:
                self._queue.remove(job)
                return True
        return False

    def fail_all(self, out: list, message: str) -> None:
        if self._active is not None:
            out.append(Failed(self._active.job.id, "server_error", message))
            self._active = None
        while self._queue:
            out.append(Failed(self._queue.popleft().id, "server_error", message))

    # -- decoding ------------------------------------------------------------------

    def step(self, out: list) -> None:
        try:
            self._step(out)
        except Exception as exc:  # the job fails, never the thread
            log.exception("transcription step failed")
            if self._active is not None:
                out.append(Failed(self._active.job.id, "server_error",
                                  f"{type(exc).__name__}: {exc}"))
                self._active = None

    def _step(self, out: list) -> None:
        if self._active is None:
            if not self._queue:
                return
            job = self._queue.popleft()
            self._active = _Active(job, mel.windows(job.samples, self.dims.n_mels,
                                                    self.window_frames))
        a = self._active
        produced = 0
        while produced < TOKENS_PER_STEP:
            if a.logits is None and not self._open_window(a):
                self._finish(a, out)
                return
            token = self._pick(a)
            limit = a.job.max_tokens
            if (token == self.eot or len(a.tokens) >= self.sample_len
                    or a.n_prompt + len(a.tokens) >= self.dims.n_text_ctx
                    or (limit is not None and a.n_tokens >= limit)):
                a.done_text += self._text(a.tokens)
                a.tokens, a.logits, a.cache, a.features = [], None, None, None
                if limit is not None and a.n_tokens >= limit:
                    a.window = len(a.windows)  # no further window
                continue
            a.tokens.append(token)
            a.n_tokens += 1
            produced += 1
            self._forward(a, [token])
        self._release(a, out, produced)

    def _open_window(self, a: _Active) -> bool:
        """Encode the next window and prefill its prompt; False when none is left."""
        import mlx.core as mx

        a.window += 1
        if a.window >= len(a.windows):
            return False
        a.features = self.model.encoder(mx.array(a.windows[a.window])[None])
        a.cache = None
        a.first = True
        prompt = self._prompt(a)
        a.n_prompt = len(prompt)
        self._forward(a, prompt)
        return True

    def _prompt(self, a: _Active) -> list[int]:
        prefix: list[int] = []
        context = (a.job.prompt or "") + a.done_text
        if context.strip() and self.sot_prev is not None:
            ids = self.tok.encode(context, add_special_tokens=False).ids
            prefix = [self.sot_prev, *ids[-(self.dims.n_text_ctx // 2 - 1):]]
        seq = [self.sot]
        if self.multilingual:
            seq += [self.languages.get(a.job.language or "en", self.languages.get("en",
                    next(iter(self.languages.values()), self.sot))), self.transcribe]
        return prefix + seq + [self.no_timestamps]

    def _forward(self, a: _Active, tokens: list[int]) -> None:
        import mlx.core as mx

        logits, a.cache = self.model.decoder(mx.array([tokens]), a.features, a.cache)
        a.logits = logits[0, -1].astype(mx.float32)

    def _pick(self, a: _Active) -> int:
        import mlx.core as mx

        suppress = self._suppress_first if a.first else self._suppress
        a.first = False
        logits = mx.where(suppress, -mx.inf, a.logits)
        if a.job.temperature > 0:
            return int(mx.random.categorical(logits / a.job.temperature).item())
        return int(mx.argmax(logits).item())

    def _text(self, tokens: list[int]) -> str:
        return self.tok.decode(tokens, skip_special_tokens=True) if tokens else ""

    def _release(self, a: _Active, out: list, produced: int) -> None:
        text = (a.done_text + self._text(a.tokens)).lstrip()
        if text.endswith("\ufffd"):  # a character cut in half: wait for its rest
            return
        if text.startswith(a.emitted) and len(text) > len(a.emitted):
            out.append(TranscriptPiece(a.job.id, text[len(a.emitted):], produced))
            a.emitted = text

    def _finish(self, a: _Active, out: list) -> None:
        text = a.done_text.lstrip()
        if text.startswith(a.emitted) and len(text) > len(a.emitted):
            out.append(TranscriptPiece(a.job.id, text[len(a.emitted):], 0))
        elif not text.startswith(a.emitted):  # detokenization changed its mind
            text = a.emitted
        out.append(Transcribed(a.job.id, text, a.n_tokens))
        self._active = None

"""Streams that outlive their process: continuing a resumable stream whose
server died, from its session log.

Theory of operation.  A stream session (X-Conversation-Id, streams.py)
records in its store's log, beside the published bytes:

- once, when it opens, its *request record*: the route, the body (which
  holds the prompt or messages, the sampler settings and seed, the grammar
  inputs, stop strings, reasoning options and LoRA scales), the headers
  that are not credentials, the API key's scope, what the request drew by
  chance (http/request_tape.py: its ids and clock), and each job's resolved
  settings (the prompt's digest and length, n_predict, the sampler
  parameters, stops, LoRA scales): what a continuation must reproduce;
- with every chunk, the token ids of the frames the chunk carries (`Tap`,
  one list append per token: batched into the write the chunk makes).

A server that finds an unfinished session in its store (`Takeover.run`:
after a restart on the same file:// directory; with Redis, a session whose
owner's heartbeat lapsed or whose store connections closed, claimed
atomically on a scan every CLAIM_SCAN_S: store_streams.py's TAKEOVER)
rebuilds the request from its record and
dispatches it into its own app below CORS (as the Vertex AI
predict route does), with a `Continuation` in the ASGI scope.  The request
then runs the ordinary route code, so the rebuilt renderer is the one the
first process had; `stream_jobs` (surfaces/streaming.py) hands its job the
published token ids as `Job.replay`.  The engine (engine/scheduler.py)
pushes those ids through the stop matcher and detokenizer as if drawn,
prefills prompt + published ids in one pass, lets the grammar and the
penalties read them from the context, and moves the seeded random stream
past their draws; the `Tap` drops the frames of the replayed events (the
log already holds them) and records the rest.  The producer appends to the
same session log from the byte offset where it stopped, so a client
resuming with the usual `GET /v1/stream?conv_id=&from=N` sees one stream: no
gap, no repeat, one final event.

Guarantees and limits.  A greedy or seeded request continues with the
tokens the first process would have drawn (the prefill of prompt +
published ids computes the same logits as the step-by-step decode, up to
float rounding).  An unseeded request continues with a fresh seed: a
complete answer, not the same one.  Mirostat's and adaptive-p's running
state is not recorded: such a stream ends with an error frame naming it
(`unreplayed_state`).  So does a stream of several generations (n > 1,
several prompts), one whose rebuilt prompt differs
from the recorded one (another model or template), and one that failed
MAX_ATTEMPTS times.  Frames carry the continuation's own timings.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import attrs
import trio

from ...protocol.records import Finished, PromptProgress, Started, TokenPiece
from ..http.errors import ApiError
from ..http.sse import error_frame
from .store_streams import MAX_ATTEMPTS, Recovered
from .store_transport import StoreDown

if TYPE_CHECKING:
    from .streams import StreamRegistry, StreamSession

log = logging.getLogger("mlxcel.takeover")

SCOPE_KEY = "mlxcel.continuation"   # ASGI scope key: never settable by a client
RELEASE_S = 5.0                     # SIGTERM: the longest the hand-off waits for its writes
# how often a replica looks for a gone peer's sessions (at most a third of
# the replica TTL): a killed peer is seen at once (its store connections
# closed), so this bounds death -> claim; one SCAN + one CLIENT LIST a time
CLAIM_SCAN_S = 1.0
FINISHED = -1                       # in a job's recorded ids: its final frame was rendered
_SECRET_HEADERS = frozenset({b"authorization", b"x-api-key", b"cookie", b"proxy-authorization",
                             b"content-length"})


def prompt_digest(prompt: Sequence[int]) -> str:
    return hashlib.sha256(",".join(map(str, prompt)).encode()).hexdigest()[:32]


def job_settings(job) -> dict:
    """A job's resolved settings, as the log records them."""
    return {"prompt": prompt_digest(job.prompt), "n_prompt": len(job.prompt),
            "n_predict": job.n_predict, "sampling": attrs.asdict(job.sampling),
            "stop": list(job.stop), "lora": list(job.lora), "ignore_eos": job.ignore_eos,
            "grammar": job.grammar is not None}


@attrs.define(eq=False)
class Continuation:
    """What a continued request carries in its ASGI scope."""
    rec: "Recovered"
    session: "StreamSession"
    attempt: int

    @property
    def key_scope(self) -> int:
        return int((self.rec.request or {}).get("scope", 0))

    @property
    def played(self) -> list:
        return list((self.rec.request or {}).get("tape", ()))

    def jobs(self, jobs: Sequence) -> list:
        """The rebuilt request's jobs, each with its published ids to replay;
        ApiError when this server cannot continue what the log recorded."""
        recorded = (self.rec.request or {}).get("jobs") or []
        if len(jobs) != 1 or len(recorded) != 1:
            raise ApiError("a stream of several generations (n > 1 or several prompts) "
                           "cannot be continued", "unavailable_error")
        job, want = jobs[0], recorded[0]
        if prompt_digest(job.prompt) != want.get("prompt"):
            raise ApiError("the rebuilt prompt differs from the recorded one (another model, "
                           "template or setting on this server)", "unavailable_error")
        why = unreplayed_state(job.sampling)
        if why is not None:
            raise ApiError(why, "unavailable_error")
        ids = [t for t in (self.rec.tokens[0] if self.rec.tokens else []) if t != FINISHED]
        return [attrs.evolve(job, replay=tuple(ids))]


def unreplayed_state(p) -> str | None:
    """Why a job's sampler cannot be continued exactly (None: it can).
    Mirostat's mu and adaptive-p's running average move with every draw and
    are not recorded, so a continuation would restart them from their initial
    values: a different distribution from the published token on.  Such a
    session ends with an error frame rather than continue on other terms."""
    if p.mirostat:
        return (f"mirostat {p.mirostat}'s running state (mu) is not recorded, so the "
                "continuation would not sample as the first process did")
    if "adaptive_p" in p.samplers and p.adaptive_target >= 0.0:
        return ("adaptive-p's running average is not recorded, so the continuation "
                "would not sample as the first process did")
    return None


def continuation(scope: dict) -> Continuation | None:
    return scope.get(SCOPE_KEY)


def played(scope: dict) -> list:
    """The draws a continued request plays back (none for a fresh one)."""
    plan = scope.get(SCOPE_KEY)
    return plan.played if plan is not None else []


class Tap:
    """Between a stream's events and its renderer: records each job's token
    ids for the log, and in a continuation drops the frames of the events
    the log already holds."""

    def __init__(self, jobs: Sequence, plan: Continuation | None = None) -> None:
        self._jobs = jobs
        self._index = {job.id: i for i, job in enumerate(jobs)}
        self._new: list[list[int]] = [[] for _ in jobs]
        self._dirty = False
        self.plan = plan
        self.request: dict | None = None
        self._skip = [len(job.replay) for job in jobs]
        self._seen = [0] * len(jobs)
        # in a continuation whose log holds bytes, the frames the first
        # events (start, progress) made were published already
        self._pre = plan is not None and plan.rec.total > 0

    def record(self, request: dict) -> None:
        """The request record the log keeps, with each job's settings."""
        self.request = {**request, "jobs": [job_settings(job) for job in self._jobs]}

    def take(self) -> list[list[int]] | None:
        """The ids recorded since the last take, per job (None: none)."""
        if not self._dirty:
            return None
        out, self._new, self._dirty = self._new, [[] for _ in self._new], False
        return out

    def render(self, fn: Callable[[object], Iterable[bytes]]) -> Callable[[object], Iterable[bytes]]:
        def wrapped(ev):
            frames = fn(ev)
            i = self._index.get(getattr(ev, "job_id", None))
            if i is None:
                return frames
            if isinstance(ev, TokenPiece):
                self._seen[i] += 1
                if self._seen[i] <= self._skip[i]:
                    return ()
                self._new[i].append(ev.token)
                self._dirty = True
            elif isinstance(ev, Finished):
                self._new[i].append(FINISHED)
                self._dirty = True
            elif isinstance(ev, (Started, PromptProgress)) and self._pre:
                return ()
            return frames
        return wrapped


def request_record(request, body: bytes, key_scope: int, tape) -> dict:
    """The request as a continuation rebuilds it (no credentials)."""
    headers = [[k.decode("latin-1"), v.decode("latin-1")]
               for k, v in request.scope.get("headers", ()) if k.lower() not in _SECRET_HEADERS]
    return {"method": request.method, "path": request.scope.get("path", request.path),
            "query": request.scope.get("query_string", b"").decode("latin-1"),
            "headers": headers, "body": base64.b64encode(body).decode(), "scope": key_scope,
            "tape": list(tape.kept) if tape is not None else []}


class Takeover:
    """Continues the unfinished sessions a restarted server finds in its
    file store, and (with a Redis store) those a gone replica owned, which
    this one claims on each scan.  `asgi` (the app below CORS) is set
    by server/app.py."""

    def __init__(self, registry: "StreamRegistry", store, bridge) -> None:
        self.registry = registry
        self.store = store
        self.bridge = bridge
        self.asgi = None
        # (key scope, session id, why) of each session given up: set by
        # server/state.py (response_store.ResponseStore.continuation_failed)
        self.on_failed: Callable[[int, str, str], None] | None = None
        self.continued = 0            # sessions continued (the first continued token reached)
        self.failed = 0               # sessions ended with an error frame
        self.first_token_sum = 0.0    # claim -> first continued byte, summed over sessions
        self.first_token_n = 0
        self.stopping = False         # SIGTERM: claim nothing more
        self.handed = 0               # ... the live streams it left to a peer
        self.released = False         # ... once their last chunks are written
        self._handing = trio.Lock()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        recovered = self.store.recovered()
        pending = []
        for rec in recovered:   # installed before the server listens: resumable at once
            session = self.registry.restore(rec)
            if session is not None and not rec.done:
                pending.append((rec, session))
        task_status.started()
        claims = getattr(self.store, "claim_orphans", None)
        if not pending and claims is None:
            return
        await self.bridge.loaded.wait()
        async with trio.open_nursery() as nursery:
            for rec, session in pending:
                nursery.start_soon(self._continue, rec, session, self.store.claim(rec))
            if claims is None:
                return
            while True:   # a peer's orphans
                await trio.sleep(min(self.store.replica_ttl_s / 3, CLAIM_SCAN_S))
                if self.stopping:
                    return
                try:
                    claimed = await claims()
                except StoreDown:
                    continue
                for rec in claimed:
                    session = self.registry.restore(rec)
                    if session is not None:
                        nursery.start_soon(self._continue, rec, session, rec.attempts)

    async def _continue(self, rec: Recovered, session: "StreamSession", attempt: int) -> None:
        t0 = time.perf_counter()
        if self.bridge.load_error is not None or not self.bridge.info.generates:
            return self._fail(session, "this server has no model that generates")
        if attempt > MAX_ATTEMPTS:
            return self._fail(session, f"it was tried {MAX_ATTEMPTS} times")
        if rec.tokens and all(FINISHED in ids for ids in rec.tokens):
            self.registry.end_continued(session)   # every final frame was published
            return
        req = rec.request
        if req is None or self.asgi is None:
            return self._fail(session, "the log holds no request to rebuild")
        status, body = await self._dispatch(req, Continuation(rec, session, attempt))
        if status != 200:
            return self._fail(session, _reason(body))
        log.info("stream %r continued from byte %d (%d published tokens, attempt %d)",
                 rec.cid, rec.total, sum(len(t) for t in rec.tokens), attempt)
        self.continued += 1
        start = rec.total
        async for _ in session.follow(start):   # until the first continued byte
            self.first_token_sum += time.perf_counter() - t0
            self.first_token_n += 1
            break

    async def _dispatch(self, req: dict, plan: Continuation) -> tuple[int, bytes]:
        body = base64.b64decode(req.get("body", ""))
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in req.get("headers", ())]
        headers.append((b"content-length", str(len(body)).encode()))
        path = req["path"]
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
                 "http_version": "1.1", "method": req.get("method", "POST"), "scheme": "http",
                 "path": path, "raw_path": path.encode(), "root_path": "",
                 "query_string": req.get("query", "").encode("latin-1"), "headers": headers,
                 "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0), "extensions": {},
                 "state": {}, SCOPE_KEY: plan}
        sent = False
        status, chunks = 0, []

        async def receive():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await trio.sleep_forever()

        with trio.CancelScope() as cs:
            async def send(message):
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                    if status == 200:   # the session's producer runs; its follower is ours
                        cs.cancel()
                elif message["type"] == "http.response.body":
                    chunks.append(message.get("body", b""))
            try:
                await self.asgi(scope, receive, send)
            except Exception as exc:  # the rebuilt request failed: the stream says why
                log.exception("continuing a stream failed")
                return 500, str(exc).encode()
        return status, b"".join(chunks)

    async def hand_off(self) -> None:
        """SIGTERM: this server's live streams are left to a peer at once
        (their last chunks written, then this replica's heartbeat removed,
        so the next peer scan claims them), or to a restart on the
        same file:// directory."""
        self.stopping = True
        # drain.py and the runner both call this, maybe at once: the second
        # waits for the first's release, then hands on only what is new
        with trio.CancelScope(shield=True), trio.move_on_after(RELEASE_S):
            async with self._handing:
                n = self.registry.hand_off()
                self.handed += n
                if n:
                    await self.store.release()
                    self.released = True
                    log.info("shutdown: %d live stream(s) handed off through the session "
                             "store", n)

    def _fail(self, session: "StreamSession", why: str) -> None:
        self.failed += 1
        log.warning("stream %r cannot be continued: %s", session.conversation_id, why)
        err = ApiError(f"the stream's server stopped and it cannot be continued: {why}",
                       "unavailable_error")
        self.registry.end_continued(session, error_frame(err))
        if self.on_failed is not None:   # a background response's run says so in its entry
            self.on_failed(session.owner, session.conversation_id, err.message)


def _reason(body: bytes) -> str:
    import json
    try:
        return json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return body.decode("utf-8", "replace")[:200] or "the rebuilt request failed"

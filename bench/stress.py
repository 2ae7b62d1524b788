"""Stress: many clients mixing routes and features; every request must end in time.

    python bench/stress.py --duration 120 --clients 8            # starts a tiny server
    python bench/stress.py --url http://127.0.0.1:8080 --pid PID  # an existing server
    python bench/stress.py --duration 60 --lora --draft          # LoRA and speculative too

Each client thread loops until the deadline, drawing an operation from the
mix below (non-streamed and streamed completions with random stop lists,
chat with and without X-Conversation-Id, streams cancelled after a few
frames, resumes of a session from a byte offset, embeddings beside chat,
grammar, n_cmpl, tokenize, the polled info routes, malformed bodies).  Each
request has a bound derived from its size: BASE_S plus, per generated
token, the single-stream token time measured at start times the number of
clients (the batch a token may wait behind), times SLACK.  A request over
its bound is a breach: while it is still running, the harness asks the server for its thread stacks
(SIGUSR1) and its trio task stacks (SIGUSR2; tests/diag/sitecustomize.py,
on when the server has MLXCEL_TEST_STACKS=1, which a server started here
has) and writes them with the breach to --out.  The exit status is 1 when
any request breached its bound or failed in a way its operation does not
allow (a 5xx on a well-formed request, a stream without its end).

This is a harness, not a test: it prints counts and latency percentiles.
bench/soak.py runs the same mix at a steady rate for an hour.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.diag import kernel_sockets  # noqa: E402

BASE_S = 10.0     # every request: connection, queueing behind a prefill, a slow box
SLACK = 3.0       # per-token allowance over the measured single-stream token time
N_PREDICT = (4, 48)
HOSTILE_TOKENS = 8   # the completions a hostile operation asks for
RAW_TIMEOUT_S = 300.0  # a raw socket's wait, as the clients' (a breach is dumped first)
# prompts are prefixes of this (words the fixtures' tokenizers know)
PROMPT = ("Your friend repairs the engine while the model builds a long answer about "
          "rivers, trains and the small stones that sit along the road to the city; "
          "then the engine builds another line of text, one word after the next.")


@dataclass
class Outcome:
    op: str
    status: int | str
    elapsed_s: float
    bound_s: float
    ok: bool
    note: str = ""


@dataclass
class Tally:
    """Outcomes of every client (appended under a lock)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    outcomes: list[Outcome] = field(default_factory=list)
    breaches: list[Outcome] = field(default_factory=list)
    failures: list[Outcome] = field(default_factory=list)

    def add(self, o: Outcome) -> bool:
        """Record `o`; True when it is a breach (over its bound)."""
        with self.lock:
            self.outcomes.append(o)
            if not o.ok:
                self.failures.append(o)
            if o.elapsed_s > o.bound_s:
                self.breaches.append(o)
                return True
        return False


class Mix:
    """The operations, each a method returning (status, ok, note, tokens)."""

    def __init__(self, url: str, prompt: str, lora: bool, seed: int,
                 fresh: float = 0.5) -> None:
        self.url = url
        self.prompt = prompt
        self.lora = lora
        self.rng = random.Random(seed)
        self.fresh = fresh
        self.pooled = self._new_client()
        self.client = self.pooled

    def _new_client(self) -> httpx.Client:
        # long enough for a stuck request to be dumped while stuck, not forever
        return httpx.Client(base_url=self.url, timeout=httpx.Timeout(300.0))

    def run(self, op: str):
        """One operation, on the kept-alive connection or (with probability
        `fresh`, as the end-to-end tests do) on a connection of its own."""
        if self.rng.random() >= self.fresh:
            self.client = self.pooled
            return getattr(self, op)()
        with self._new_client() as self.client:
            return getattr(self, op)()

    def _n(self) -> int:
        return self.rng.randint(*N_PREDICT)

    def _stops(self) -> list[str]:
        words = self.prompt.split()
        return [self.rng.choice(words)[: self.rng.randint(1, 4)]
                for _ in range(self.rng.randint(0, 3))]

    def _base(self, n: int) -> dict:
        body: dict = {"n_predict": n, "temperature": self.rng.choice((0, 0.8)),
                      "cache_prompt": self.rng.random() < 0.7}
        if self.lora and self.rng.random() < 0.3:
            body["lora"] = [{"id": 0, "scale": self.rng.choice((0.0, 0.5, 1.0))}]
        return body

    def _prompt(self) -> str:
        words = self.prompt.split()
        k = self.rng.randint(4, len(words))
        return " ".join(words[:k])

    # -- operations -------------------------------------------------------------------

    def completion(self):
        n = self._n()
        body = {**self._base(n), "prompt": self._prompt(), "stop": self._stops()}
        r = self.client.post("/completion", json=body)
        return r.status_code, r.status_code == 200 and "content" in r.json(), "", n

    def completion_stream(self):
        n = self._n()
        body = {**self._base(n), "prompt": self._prompt(), "stream": True,
                "stop": self._stops()}
        with self.client.stream("POST", "/completion", json=body) as r:
            last = None
            for line in r.iter_lines():
                if line.startswith("data: "):
                    last = json.loads(line[6:])
        return r.status_code, r.status_code == 200 and bool(last and last.get("stop")), "", n

    def n_cmpl(self):
        n = self._n()
        body = {**self._base(n), "prompt": self._prompt(), "n_cmpl": 2}
        r = self.client.post("/completion", json=body)
        return r.status_code, r.status_code == 200, "", 2 * n

    def grammar(self):
        n = self._n()
        body = {**self._base(n), "prompt": self._prompt(),
                "json_schema": {"type": "object", "properties": {
                    "a": {"type": "integer"}}, "required": ["a"]}}
        r = self.client.post("/completion", json=body)
        return r.status_code, r.status_code == 200, "", n

    def chat(self):
        n = self._n()
        body = {"messages": [{"role": "user", "content": self._prompt()}],
                "max_tokens": n, "temperature": 0}
        r = self.client.post("/v1/chat/completions", json=body)
        return r.status_code, r.status_code == 200, "", n

    def chat_stream(self, conv: bool = False):
        n = self._n()
        body = {"messages": [{"role": "user", "content": self._prompt()}],
                "max_tokens": n, "stream": True}
        headers = {"X-Conversation-Id": f"stress-{uuid.uuid4().hex}"} if conv else {}
        done = False
        with self.client.stream("POST", "/v1/chat/completions", json=body,
                                headers=headers) as r:
            for line in r.iter_lines():
                done = done or line == "data: [DONE]"
        return r.status_code, r.status_code == 200 and done, "", n

    def chat_stream_conv(self):
        return self.chat_stream(conv=True)

    def cancel(self):
        """A stream dropped after a few frames (a client disconnect)."""
        n = 48
        body = {**self._base(n), "prompt": self._prompt(), "stream": True}
        keep = self.rng.randint(0, 4)
        with self.client.stream("POST", "/completion", json=body) as r:
            seen = 0
            for line in r.iter_lines():
                if line.startswith("data: "):
                    seen += 1
                    if seen > keep:
                        break
        return r.status_code, r.status_code == 200, "", keep + 1

    def resume(self):
        """A session's stream dropped, then followed again from a byte offset."""
        n = self._n()
        cid = f"stress-{uuid.uuid4().hex}"
        body = {"messages": [{"role": "user", "content": self._prompt()}],
                "max_tokens": n, "stream": True}
        first = b""
        with self.client.stream("POST", "/v1/chat/completions", json=body,
                                headers={"X-Conversation-Id": cid}) as r:
            status = r.status_code
            for chunk in r.iter_bytes():
                first += chunk
                if len(first) > 64:
                    break
        if status != 200:
            return status, False, "first leg", n
        got = len(first)
        done = b"data: [DONE]" in first  # a short answer may come whole in the first leg
        with self.client.stream("GET", "/v1/stream",
                                params={"conv_id": cid, "from": str(got)}) as r:
            for line in r.iter_lines():
                done = done or line == "data: [DONE]"
        # a session may already have been swept or refused (503 at capacity)
        return r.status_code, (r.status_code == 200 and done) or r.status_code in (404, 503), \
            "", n

    def embeddings(self):
        r = self.client.post("/embeddings", json={"content": self._prompt()})
        return r.status_code, r.status_code < 500 or r.status_code == 501, "", 1

    def tokenize(self):
        r = self.client.post("/tokenize", json={"content": self._prompt()})
        return r.status_code, r.status_code == 200, "", 1

    def info(self):
        path = self.rng.choice(("/health", "/props", "/metrics", "/slots", "/v1/models"))
        r = self.client.get(path)
        return r.status_code, r.status_code < 500 or r.status_code == 501, path, 1

    def malformed(self):
        body = self.rng.choice((b"{", b"[1, 2", b'{"prompt": NaN}', b"",
                                b'{"n_predict": 4}', b'{"prompt": 5}'))
        r = self.client.post("/completion", content=body,
                             headers={"Content-Type": "application/json"})
        return r.status_code, 400 <= r.status_code < 500, "", 1

    # -- what the hostile-input and transport tests do to their shared server, on raw
    # sockets: each kind returns whether the server kept to HTTP/1.1 (every
    # expected answer whole, no 5xx); a connection the server leaves open
    # and silent shows as a breach (the socket's timeout is past the bound)

    def hostile(self):
        kind = self.rng.choice(self.HOSTILE)
        ok = getattr(self, f"_{kind}")()
        return kind, ok, "", HOSTILE_TOKENS

    HOSTILE = ("pipelined", "half_closed", "expect_100", "abandoned_head", "early_close",
               "oversized", "chunked")

    def _raw(self) -> socket.socket:
        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        return socket.create_connection((host, int(port)), timeout=RAW_TIMEOUT_S)

    def _request(self, path: str, body: bytes | None, extra: str = "") -> bytes:
        method = "GET" if body is None else "POST"
        head = f"{method} {path} HTTP/1.1\r\nHost: stress\r\n{extra}"
        if body is None:
            return f"{head}\r\n".encode()
        return (f"{head}Content-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    def _small(self) -> bytes:
        return json.dumps({"prompt": self._prompt(), "n_predict": HOSTILE_TOKENS}).encode()

    @staticmethod
    def _to_eof(s: socket.socket) -> bytes:
        reply = b""
        try:
            while chunk := s.recv(65536):
                reply += chunk
        except ConnectionResetError:  # an end as well (the server had unread bytes)
            pass
        return reply

    @staticmethod
    def _statuses(reply: bytes) -> list[int]:
        return [int(reply[i + 9:i + 12]) for i in range(len(reply))
                if reply.startswith(b"HTTP/1.1 ", i) and reply[i + 9:i + 12].isdigit()]

    def _pipelined(self) -> bool:
        """Three requests in one write, the last asking to close: three answers."""
        with self._raw() as s:
            s.sendall(self._request("/health", None) + self._request("/completion", self._small())
                      + self._request("/tokenize", b'{"content": "a b"}', "Connection: close\r\n"))
            statuses = self._statuses(self._to_eof(s))
        return len(statuses) == 3 and max(statuses) < 500

    def _half_closed(self) -> bool:
        """A request, then the client's end shut: one 200, whole or (the job
        cancelled after a second, as upstream) empty; never a bare close."""
        with self._raw() as s:
            s.sendall(self._request("/completion", self._small()))
            s.shutdown(socket.SHUT_WR)
            return self._statuses(self._to_eof(s)) == [200]

    def _expect_100(self) -> bool:
        body = self._small()
        with self._raw() as s:
            s.sendall(self._request("/completion", body, "Expect: 100-continue\r\n"
                                    "Connection: close\r\n")[:-len(body)])
            interim = b""
            while b"\r\n\r\n" not in interim:
                chunk = s.recv(65536)
                if not chunk:
                    return False
                interim += chunk
            if not interim.startswith(b"HTTP/1.1 100"):
                return False
            s.sendall(body)
            return self._statuses(interim + self._to_eof(s)) == [100, 200]

    def _abandoned_head(self) -> bool:
        with self._raw() as s:
            s.sendall(b"POST /completion HTTP/1.1\r\nHost: stress\r\nContent-Le")
        return True

    def _early_close(self) -> bool:
        """A generation asked for and the connection dropped before its answer."""
        with self._raw() as s:
            s.sendall(self._request("/completion", json.dumps(
                {"prompt": self._prompt(), "n_predict": N_PREDICT[1]}).encode()))
        return True

    def _oversized(self) -> bool:
        with self._raw() as s:
            s.sendall(b"POST /completion HTTP/1.1\r\nHost: stress\r\n"
                      b"Content-Length: 1000000000\r\n\r\n{")
            return self._statuses(self._to_eof(s)) == [413]

    def _chunked(self) -> bool:
        body = self._small()
        with self._raw() as s:
            s.sendall(b"POST /completion HTTP/1.1\r\nHost: stress\r\nConnection: close\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n"
                      + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
            return self._statuses(self._to_eof(s)) == [200]

    OPS: dict[str, float] = {
        "completion": 4, "completion_stream": 3, "n_cmpl": 1, "grammar": 1, "chat": 2,
        "chat_stream": 2, "chat_stream_conv": 1, "cancel": 2, "resume": 1,
        "embeddings": 1, "tokenize": 1, "info": 2, "malformed": 1, "hostile": 1,
    }

    def draw(self) -> str:
        names = list(self.OPS)
        return self.rng.choices(names, weights=[self.OPS[k] for k in names])[0]


def token_time(url: str, prompt: str) -> float:
    """Seconds per generated token of one lone stream (the bounds' unit)."""
    n = 32
    with httpx.Client(base_url=url, timeout=120) as c:
        c.post("/completion", json={"prompt": prompt, "n_predict": 4})  # warm
        t = time.monotonic()
        r = c.post("/completion", json={"prompt": prompt, "n_predict": n, "ignore_eos": True,
                                        "cache_prompt": False})
        r.raise_for_status()
        return (time.monotonic() - t) / n


def bound_for(tokens: int, t_tok: float, clients: int) -> float:
    return BASE_S + SLACK * t_tok * tokens * max(1, clients)


class Dumper:
    """Asks the server for its thread and trio task stacks on a breach."""

    def __init__(self, out: Path, pid: int | None, server=None) -> None:
        self.out, self.pid, self.server = out, pid, server
        self.lock = threading.Lock()
        self.n = 0

    def dump(self, o: Outcome) -> Path | None:
        with self.lock:
            self.n += 1
            path = self.out / f"breach-{self.n}.txt"
            text = [f"breach: {o}\n"]
            if self.server is not None:
                before = len(self.server.stderr)
                self.server.stacks()
                text += ["--- server stderr (stacks) ---\n", *self.server.stderr[before:],
                         "--- server log tail ---\n", *self.server.stdout[-200:],
                         "--- ", kernel_sockets.describe(self.server.port)]
            elif self.pid is not None:
                for sig in (signal.SIGUSR1, signal.SIGUSR2):
                    try:
                        os.kill(self.pid, sig)
                    except OSError:
                        pass
                text.append(f"sent SIGUSR1 and SIGUSR2 to {self.pid}: see its stderr\n")
            path.write_text("".join(text))
            return path


class InFlight:
    """The requests under way, watched by one thread: a request past its
    bound is dumped while it is still stuck (its stacks then show where it
    waits), once."""

    def __init__(self, dumper: Dumper) -> None:
        self.dumper = dumper
        self.lock = threading.Lock()
        self.running: dict[int, list] = {}   # thread id -> [op, started, bound, dumped]

    def begin(self, op: str, bound: float) -> None:
        with self.lock:
            self.running[threading.get_ident()] = [op, time.monotonic(), bound, False]

    def end(self) -> bool:
        """Whether this thread's request was already dumped while stuck."""
        with self.lock:
            entry = self.running.pop(threading.get_ident(), None)
        return bool(entry and entry[3])

    def watch(self, stop: threading.Event) -> None:
        while not stop.wait(1.0):
            now = time.monotonic()
            with self.lock:
                stuck = [e for e in self.running.values() if not e[3] and now - e[1] > e[2]]
                for e in stuck:
                    e[3] = True
            for op, started, bound, _ in stuck:
                o = Outcome(op, "in flight", now - started, bound, False, "still running")
                where = self.dumper.dump(o)
                print(f"STUCK {op}: {now - started:.1f} s > {bound:.1f} s, still running; "
                      f"stacks: {where}", flush=True)


def client_loop(mix: Mix, deadline: float, t_tok: float, clients: int, tally: Tally,
                watch: InFlight, stop: threading.Event, rate: float | None,
                counted_after: float) -> None:
    while time.monotonic() < deadline and not stop.is_set():
        op = mix.draw()
        started = time.monotonic()
        # the bound before the size is known: the largest this op can draw
        watch.begin(op, bound_for(2 * N_PREDICT[1], t_tok, clients))
        try:
            status, ok, note, tokens = mix.run(op)
        except (httpx.HTTPError, json.JSONDecodeError, ValueError, OSError) as exc:
            status, ok, note, tokens = type(exc).__name__, False, str(exc)[:200], N_PREDICT[1]
        dumped = watch.end()
        elapsed = time.monotonic() - started
        if started < counted_after:  # the warm-up: first batches compile their shapes
            continue
        o = Outcome(op, status, elapsed, bound_for(tokens, t_tok, clients), ok, note)
        if tally.add(o) and not dumped:
            where = watch.dumper.dump(o)
            print(f"BREACH {op}: {elapsed:.1f} s > {o.bound_s:.1f} s; stacks: {where}",
                  flush=True)
        if rate:  # a steady rate per client (the soak): sleep out the period
            time.sleep(max(0.0, 1.0 / rate - elapsed) * mix.rng.uniform(0.5, 1.5))


def start_own_server(kind: str, args: list[str], lora: bool, draft: bool):
    from fixtures.build import ensure
    from tests.conftest import ServerProcess, derive_draft

    model = ensure(kind)
    extra = list(args)
    if lora:
        extra += ["--lora", str(ensure("tiny-lora"))]
    if draft:
        extra += ["-md", str(derive_draft(model, Path(os.environ.get(
            "TMPDIR", "/tmp")) / f"stress-draft-{os.getpid()}"))]
    return ServerProcess(model, *extra).start()


def summarize(tally: Tally, wall_s: float) -> dict:
    by_op: dict[str, list[float]] = {}
    for o in tally.outcomes:
        by_op.setdefault(o.op, []).append(o.elapsed_s)
    rows = {}
    for op, xs in sorted(by_op.items()):
        xs.sort()
        rows[op] = {"n": len(xs), "p50_s": round(statistics.median(xs), 3),
                    "p99_s": round(xs[min(len(xs) - 1, int(0.99 * len(xs)))], 3),
                    "max_s": round(xs[-1], 3)}
    return {"wall_s": round(wall_s, 1), "requests": len(tally.outcomes),
            "breaches": len(tally.breaches), "failures": len(tally.failures),
            "failed": [o.__dict__ for o in tally.failures[:20]], "by_op": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", help="an already running server (else one is started)")
    p.add_argument("--pid", type=int, help="the --url server's pid, for the stack signals")
    p.add_argument("--fixture", default="tiny", help="fixture checkpoint of a started server")
    p.add_argument("--server-args", default="-c 4096 -np 4",
                   help="options of a started server (default: the tests' shared server)")
    p.add_argument("--lora", action="store_true", help="serve tiny-lora; some requests scale it")
    p.add_argument("--draft", action="store_true", help="serve a draft model (speculative)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--warmup", type=float, default=10.0,
                   help="seconds of load before the bounds count (first batches compile)")
    p.add_argument("--rate", type=float, help="requests per second per client (default: flat out)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fresh", type=float, default=0.5,
                   help="share of requests sent on a new connection (the rest keep-alive)")
    p.add_argument("--out", type=Path, default=Path("stress-out"))
    p.add_argument("--keep-going", action="store_true", help="do not stop at the first breach")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    srv = None
    if a.url is None:
        srv = start_own_server(a.fixture, a.server_args.split(), a.lora, a.draft)
        url = srv.url
    else:
        url = a.url
    try:
        return run(a, url, srv)
    finally:
        if srv is not None:
            srv.stop()


def run(a, url: str, srv) -> int:
    prompt = PROMPT
    t_tok = token_time(url, prompt)
    print(f"stress: {url}, {a.clients} clients, {a.duration:.0f} s; "
          f"lone token time {t_tok * 1000:.1f} ms", flush=True)
    tally = Tally()
    watch = InFlight(Dumper(a.out, a.pid, srv))
    stop = threading.Event()
    started = time.monotonic()
    deadline = started + a.warmup + a.duration
    mixes = [Mix(url, prompt, a.lora, a.seed * 1000 + i, a.fresh) for i in range(a.clients)]
    threads = [threading.Thread(target=client_loop, daemon=True, args=(
        m, deadline, t_tok, a.clients, tally, watch, stop, a.rate, started + a.warmup))
        for m in mixes]
    for t in threads:
        t.start()
    watcher = threading.Thread(target=watch.watch, args=(stop,), daemon=True)
    watcher.start()
    try:
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(1.0)
            if tally.breaches and not a.keep_going:
                stop.set()
    except KeyboardInterrupt:
        pass
    stop.set()
    report = summarize(tally, time.monotonic() - started)
    report["token_time_s"] = t_tok
    (a.out / "stress.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "failed"}, indent=1))
    for o in tally.failures[:10]:
        print(f"failed: {o}")
    return 1 if tally.breaches or tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())

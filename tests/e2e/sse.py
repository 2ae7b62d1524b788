"""Tiny SSE helpers for the end-to-end tests."""

from __future__ import annotations

import json

import httpx


def iter_sse_lines(r: httpx.Response):
    """Lines split on "\n" only: JSON frames carry U+2028 / U+0085 unescaped,
    which httpx's iter_lines() would also split on."""
    buf = ""
    for chunk in r.iter_text():
        buf += chunk
        *lines, buf = buf.split("\n")
        yield from (ln.rstrip("\r") for ln in lines)
    if buf:
        yield buf


def stream_frames(url: str, body: dict, path: str = "/completion", timeout: float = 60,
                  headers: dict | None = None) -> tuple[list, list[str]]:
    """POST a streaming request; return (decoded data frames, raw lines)."""
    frames, raw = [], []
    with httpx.Client(timeout=timeout) as c:
        with c.stream("POST", url + path, json={**body, "stream": True}, headers=headers) as r:
            assert r.status_code == 200, r.read()
            assert r.headers["content-type"].startswith("text/event-stream")
            for line in iter_sse_lines(r):
                raw.append(line)
                if line.startswith("data: "):
                    data = line[6:]
                    frames.append(data if data == "[DONE]" else json.loads(data))
    return frames, raw


def post(url: str, body, path: str = "/completion", timeout: float = 60, **kw) -> httpx.Response:
    with httpx.Client(timeout=timeout) as c:
        if isinstance(body, (bytes, str)):
            return c.post(url + path, content=body, **kw)
        return c.post(url + path, json=body, **kw)


def complete(server, **body) -> dict:
    """A /completion that must succeed; its JSON."""
    r = post(server.url, body)
    assert r.status_code == 200, r.text
    return r.json()


def error(server, **body) -> str:
    """A /completion that must be refused with 400; its message."""
    r = post(server.url, body)
    assert r.status_code == 400, r.text
    return r.json()["error"]["message"]


class EventWatcher:
    """A client of an SSE route on its own thread, collecting each `data:`
    frame (decoded) until one whose `event` is in `until`; `start()`
    returns once the stream is open, so nothing published later is missed."""

    def __init__(self, url: str, until: set[str], timeout: float = 120) -> None:
        import threading

        self.url, self.until, self.timeout = url, until, timeout
        self.events: list = []
        self._open = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout) as c, c.stream("GET", self.url) as s:
            self._open.set()
            for line in iter_sse_lines(s):
                if line.startswith("data: "):
                    self.events.append(json.loads(line[6:]))
                    if self.events[-1].get("event") in self.until:
                        return

    def start(self) -> "EventWatcher":
        self._thread.start()
        assert self._open.wait(30), f"{self.url}: the event stream did not open"
        return self

    def join(self) -> list:
        self._thread.join(self.timeout)
        return self.events


def startup_refusal(model, *args: str) -> str:
    """The stderr of a server start that must fail before serving (exit 1,
    no traceback)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "mlxcel_trio", "-m", str(model), *args,
                           "--port", "0"], check=False, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stderr

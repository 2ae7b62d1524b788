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

"""Tiny SSE helpers for the end-to-end tests."""

from __future__ import annotations

import json

import httpx


def stream_frames(url: str, body: dict, path: str = "/completion", timeout: float = 60,
                  headers: dict | None = None) -> tuple[list, list[str]]:
    """POST a streaming request; return (decoded data frames, raw lines)."""
    frames, raw = [], []
    with httpx.Client(timeout=timeout) as c:
        with c.stream("POST", url + path, json={**body, "stream": True}, headers=headers) as r:
            assert r.status_code == 200, r.read()
            assert r.headers["content-type"].startswith("text/event-stream")
            for line in r.iter_lines():
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

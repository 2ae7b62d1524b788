"""Forwarding one request to a model's child and its answer back.

The body goes to the child byte for byte, the answer comes back as the
child sends it (a stream frame by frame).  When the client goes away the
router's response body is cancelled, which closes the connection to the
child, which frees the slot there exactly as a direct disconnect would."""

from __future__ import annotations

import logging
from typing import AsyncIterator

import httpx
from quart import Response

from ..http.errors import router_error
from .pool import Instance

log = logging.getLogger("mlxcel.router")

# hop-by-hop headers (RFC 9110 7.6.1) and what the client library sets itself
_DROP_REQUEST = frozenset({"host", "content-length", "connection", "keep-alive",
                           "transfer-encoding", "te", "upgrade", "proxy-connection"})
_DROP_RESPONSE = frozenset({"connection", "keep-alive", "transfer-encoding", "server"})


def client() -> httpx.AsyncClient:
    """One client for every child: loopback only, no read timeout (a stream
    is as long as its generation), a bounded connect."""
    return httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0),
                             limits=httpx.Limits(max_connections=None,
                                                 max_keepalive_connections=64),
                             trust_env=False)


async def forward(http: httpx.AsyncClient, inst: Instance, method: str, path: str,
                  query: bytes, headers, body: bytes) -> Response:
    url = inst.base_url + path + (("?" + query.decode("latin-1")) if query else "")
    sent = [(k, v) for k, v in headers if k.lower() not in _DROP_REQUEST]
    inst.inflight += 1
    try:
        upstream = await http.send(http.build_request(method, url, headers=sent, content=body),
                                   stream=True)
    except httpx.HTTPError as exc:
        inst.inflight -= 1
        log.warning("%s: forwarding %s %s failed: %s", inst.name, method, path, exc)
        raise router_error("child_unreachable", name=inst.name,
                           why=type(exc).__name__) from None

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:  # the child went away mid-answer
            log.warning("%s: answer to %s %s cut: %s", inst.name, method, path, exc)
        finally:
            inst.inflight -= 1
            await upstream.aclose()

    out = Response(relay(), status=upstream.status_code)
    out.headers.clear()
    for k, v in upstream.headers.multi_items():
        if k.lower() not in _DROP_RESPONSE:
            out.headers.add(k, v)
    out.timeout = None
    return out

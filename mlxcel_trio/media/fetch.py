"""http(s) media fetches behind the SSRF guard.

Three checks, each against the policy's address predicate (ssrf.py):

1. Before the request: the scheme is http or https, the URL carries no
   credentials, an IP-literal host is checked as written and a host name is
   resolved with every resulting address checked.
2. On every redirect: redirects are followed here, not by httpx, so each
   next URL goes through check 1 before it is requested; at most
   MAX_REDIRECTS hops.
3. After the connection: the peer the socket actually reached is read from
   the response's ``network_stream`` extension (``server_addr``, i.e. the
   socket's getpeername) and checked before a body byte is read.

Why the peer check rather than connecting to a pinned, pre-resolved IP:
httpx resolves the name again when it connects, so a DNS answer that
changes between check 1 and the connect (rebinding) would slip past a
pre-check alone.  The peer address is the ground truth of where the bytes
come from, independent of which resolver ran, of happy-eyeballs address
order and of TLS (SNI and certificate checks keep the URL's name untouched,
which pinning would have to re-plumb).  If the transport cannot say which
peer it reached, the fetch is refused: the guard fails closed.  Proxies
from the environment are ignored (``trust_env=False``), so the peer is
always the origin server, and each fetch uses its own client, so no pooled
connection made under another policy is reused.

The body is read raw (``Accept-Encoding: identity``, no decompression, so
no compression bomb) and stops at the byte budget; a Content-Length over it
is refused before reading.  The whole fetch, redirects included, runs under
one deadline (policy.timeout, 10 s by default).
"""

from __future__ import annotations

import ipaddress
import socket

import anyio
import httpx

from .errors import DOWNLOAD_FAILED, MediaError, too_large
from .policy import MediaPolicy
from .ssrf import ALLOW_PRIVATE_ENV, IPAddress, refusal

MAX_REDIRECTS = 5
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


def _failed(why: str) -> MediaError:
    return MediaError(f"{DOWNLOAD_FAILED}: {why}")


def _refused(address: IPAddress) -> MediaError:
    why = refusal(address) or "refused by the address policy"
    return _failed(f"the URL reaches a non-public address ({why}); media URLs must be "
                   f"public unless the server sets {ALLOW_PRIVATE_ENV}=1")


async def _system_resolve(host: str, port: int) -> list[str]:
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def _address(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


async def check_url(url: str | httpx.URL, policy: MediaPolicy) -> httpx.URL:
    """Check 1 of the module docstring; the parsed URL when it passes."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        raise _failed("the URL is not valid") from None
    if parsed.scheme not in ("http", "https"):
        raise _failed("only http and https URLs are fetched")
    if parsed.userinfo:
        raise _failed("the URL may not carry credentials")
    host = parsed.host
    if not host:
        raise _failed("the URL has no host")
    if policy.allow_private:
        return parsed
    literal = _address(host)
    if literal is not None:
        if not policy.permits(literal):
            raise _refused(literal)
        return parsed
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    resolve = policy.resolver or _system_resolve
    try:
        addresses = [a for a in map(_address, await resolve(host, port)) if a is not None]
    except OSError:
        raise _failed("the host name does not resolve") from None
    if not addresses:
        raise _failed("the host name does not resolve")
    for address in addresses:
        if not policy.permits(address):
            raise _refused(address)
    return parsed


def check_peer(response: httpx.Response, policy: MediaPolicy) -> None:
    """Check 3: the address the connection reached (fails closed)."""
    if policy.allow_private:
        return
    stream = response.extensions.get("network_stream")
    peer = stream.get_extra_info("server_addr") if stream is not None else None
    address = _address(str(peer[0])) if peer else None
    if address is None:
        raise _failed("the address the connection reached could not be checked")
    if not policy.permits(address):
        raise _refused(address)


async def _read_capped(response: httpx.Response, max_bytes: int) -> bytes:
    length = response.headers.get("content-length", "")
    if length.isdigit() and int(length) > max_bytes:
        raise too_large("the downloaded media", max_bytes)
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += chunk
        if len(body) > max_bytes:
            raise too_large("the downloaded media", max_bytes)
    return bytes(body)


async def _fetch(url: str, policy: MediaPolicy) -> bytes:
    async with httpx.AsyncClient(trust_env=False, follow_redirects=False,
                                 timeout=policy.timeout,
                                 headers={"Accept-Encoding": "identity"}) as client:
        target = await check_url(url, policy)
        for hop in range(MAX_REDIRECTS + 1):
            async with client.stream("GET", target) as response:
                check_peer(response, policy)
                if response.status_code in _REDIRECTS and "location" in response.headers:
                    if hop == MAX_REDIRECTS:
                        raise _failed(f"more than {MAX_REDIRECTS} redirects")
                    try:
                        following = target.join(response.headers["location"])
                    except (httpx.InvalidURL, ValueError):
                        raise _failed("a redirect named an invalid URL") from None
                    target = await check_url(following, policy)
                    continue
                if not 200 <= response.status_code < 300:
                    raise _failed(f"the server answered HTTP {response.status_code}")
                return await _read_capped(response, policy.max_bytes)
    raise AssertionError("unreachable")  # the loop returns or raises


async def fetch(url: str, policy: MediaPolicy) -> bytes:
    """The body `url` answers with, within the policy (module docstring)."""
    try:
        with anyio.fail_after(policy.timeout):
            return await _fetch(url, policy)
    except TimeoutError:
        raise _failed(f"no complete answer within {policy.timeout:g} seconds") from None
    except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
        raise _failed(f"the request failed ({type(exc).__name__})") from None

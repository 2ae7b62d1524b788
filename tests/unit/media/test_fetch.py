"""http(s) media fetches against a local server that plays the attacker.

The server listens on 127.0.0.1 only; every other address a test names
(127.0.0.2, 169.254.169.254, a stub DNS answer) is refused before a
connection is made, so no traffic leaves the machine.  A test that needs
an "allowed origin" uses the policy's address predicate to admit
127.0.0.1 alone.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mlxcel_trio.media import MediaError, MediaPolicy, read_media
from mlxcel_trio.media.fetch import MAX_REDIRECTS
from mlxcel_trio.media.ssrf import is_public

IMAGE = b"\x89PNG fetched"


class _Handler(BaseHTTPRequestHandler):
    hits: list[str]

    def log_message(self, *args):  # quiet
        pass

    def _send(self, status: int, body: bytes = b"", **headers: str) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k.replace("_", "-"), v)
        if "Content_Length" not in headers and "Transfer_Encoding" not in headers:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.server.hits.append(self.path)
        path, _, query = self.path.partition("?")
        if path == "/image":
            self._send(200, IMAGE)
        elif path == "/to":
            self._send(302, Location=query)
        elif path.startswith("/chain/"):
            left = int(path.rsplit("/", 1)[1])
            self._send(302, Location=f"/chain/{left - 1}") if left else self._send(200, IMAGE)
        elif path == "/big":
            self._send(200, b"x" * (2 << 20))
        elif path == "/endless":  # chunked, no length, until the client goes away
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b"y" * 65536
            try:
                for _ in range(4096):  # bounded even if the client never stops
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except OSError:
                pass
        else:
            self._send(404, b"no")


@pytest.fixture(scope="module")
def origin():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.hits = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def base(origin):
    origin.hits.clear()
    return f"http://127.0.0.1:{origin.server_address[1]}"


def only_loopback_one(address) -> bool:
    """An allowed origin for tests: 127.0.0.1 and the public internet."""
    return address == ipaddress.ip_address("127.0.0.1") or is_public(address)


ORIGIN_ONLY = MediaPolicy(address_allowed=only_loopback_one)


async def refused(url: str, policy: MediaPolicy) -> str:
    with pytest.raises(MediaError) as info:
        await read_media(url, policy)
    assert info.value.status == 400 and info.value.type == "invalid_request_error"
    assert info.value.message.startswith("Failed to download image: ") or \
        "exceeds the media payload limit" in info.value.message
    return info.value.message


async def test_loopback_is_refused_by_default_before_connecting(base, origin):
    message = await refused(f"{base}/image", MediaPolicy())
    assert "non-public address (loopback)" in message
    assert "MLXCEL_ALLOW_PRIVATE_MEDIA_URLS=1" in message
    assert origin.hits == []


async def test_the_allow_switch_fetches_it(base, origin):
    assert await read_media(f"{base}/image", MediaPolicy(allow_private=True)) == IMAGE
    assert origin.hits == ["/image"]


async def test_an_allowed_origin_is_fetched(base):
    assert await read_media(f"{base}/image", ORIGIN_ONLY) == IMAGE


@pytest.mark.parametrize("target, why", [
    ("http://127.0.0.2:{port}/image", "loopback"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://[::ffff:169.254.169.254]/", "link-local, written as IPv6"),
    ("http://10.0.0.1/", "private"),
])
async def test_a_redirect_to_a_refused_address_is_not_followed(base, origin, target, why):
    target = target.format(port=origin.server_address[1])
    message = await refused(f"{base}/to?{target}", ORIGIN_ONLY)
    assert f"non-public address ({why})" in message.replace("(IPv4 ", "(")
    assert origin.hits == [f"/to?{target}"]  # the target was never requested


async def test_a_redirect_to_another_scheme_is_refused(base):
    message = await refused(f"{base}/to?ftp://example.com/x", ORIGIN_ONLY)
    assert "only http and https" in message


async def test_redirects_are_followed_up_to_five_hops(base, origin):
    assert await read_media(f"{base}/chain/{MAX_REDIRECTS}", ORIGIN_ONLY) == IMAGE
    assert len(origin.hits) == MAX_REDIRECTS + 1
    origin.hits.clear()
    message = await refused(f"{base}/chain/{MAX_REDIRECTS + 1}", ORIGIN_ONLY)
    assert "more than 5 redirects" in message
    assert len(origin.hits) == MAX_REDIRECTS + 1  # the sixth redirect is not followed


def stub_dns(answers: dict[str, list[str]]):
    async def resolve(host: str, port: int) -> list[str]:
        if host not in answers:
            raise socket.gaierror("no such name")
        return answers[host]
    return resolve


@pytest.mark.parametrize("answer, why", [
    (["10.1.2.3"], "private"),
    (["93.184.216.34", "127.0.0.1"], "loopback"),  # every address is checked
    (["fd00::1"], "unique-local"),
    (["::ffff:192.168.1.1"], "private, written as IPv6"),
])
async def test_a_name_resolving_to_a_refused_address(answer, why):
    policy = MediaPolicy(resolver=stub_dns({"media.example": answer}))
    message = await refused("https://media.example/cat.png", policy)
    assert f"non-public address ({why})" in message.replace("(IPv4 ", "(")


async def test_a_name_that_does_not_resolve():
    policy = MediaPolicy(resolver=stub_dns({}))
    assert "does not resolve" in await refused("https://nowhere.example/x", policy)


async def test_the_connected_peer_is_checked_before_the_body(origin):
    """DNS rebinding: the pre-check's answer is public, the connection
    reaches 127.0.0.1; the peer check refuses before reading the body."""
    port = origin.server_address[1]
    policy = MediaPolicy(resolver=stub_dns({"localhost": ["93.184.216.34"]}))
    message = await refused(f"http://localhost:{port}/image", policy)
    assert "non-public address (loopback)" in message


@pytest.mark.parametrize("url", [
    "http://[::ffff:127.0.0.1]/", "http://[::ffff:7f00:1]:80/", "http://[::127.0.0.1]/",
])
async def test_ipv4_mapped_ipv6_literals(url):
    assert "loopback, written as IPv6" in await refused(url, MediaPolicy())


@pytest.mark.parametrize("url", [
    "http://user:secret@example.com/cat.png", "http://user@example.com/cat.png",
])
async def test_credentials_in_the_url(url):
    policy = MediaPolicy(allow_private=True)  # refused even with the switch on
    assert "may not carry credentials" in await refused(url, policy)


@pytest.mark.parametrize("url", ["ftp://example.com/cat.png", "gopher://example.com/",
                                 "ssh://example.com/x"])
async def test_other_schemes(url):
    assert "only http and https" in await refused(url, MediaPolicy(allow_private=True))


async def test_a_server_that_never_answers_is_bounded():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # connections complete in the backlog; nothing ever answers
    try:
        port = silent.getsockname()[1]
        start = time.monotonic()
        message = await refused(f"http://127.0.0.1:{port}/x",
                                MediaPolicy(allow_private=True, timeout=0.5))
        assert time.monotonic() - start < 5
        assert "within 0.5 seconds" in message or "ReadTimeout" in message
    finally:
        silent.close()


async def test_an_oversized_body_stops_at_the_cap(base):
    policy = MediaPolicy(allow_private=True, max_bytes=1 << 20)
    assert "exceeds the media payload limit of 1048576 bytes" in \
        await refused(f"{base}/big", policy)  # refused from its Content-Length
    start = time.monotonic()
    assert "exceeds the media payload limit" in await refused(f"{base}/endless", policy)
    assert time.monotonic() - start < 5


async def test_an_error_status_is_a_failed_download(base):
    assert "the server answered HTTP 404" in \
        await refused(f"{base}/missing", MediaPolicy(allow_private=True))

"""Transport against real processes: TLS with a certificate made here, a Unix
domain socket, --port 0, --api-prefix, --timeout on a slow body and on a
stream that outlasts it, and CORS
compared header for header with upstream's rules (server-http.cpp's
pre-routing handler: Allow-Origin on every response, OPTIONS answered on any
path before the loading gate, the key check and the router)."""

from __future__ import annotations

import datetime
import ipaddress
import json
import re
import socket
import ssl
import time

import httpx
import pytest

from .sse import iter_sse_lines, post

pytestmark = pytest.mark.e2e

KEY = "transport-key-4e1b"
LISTENING = re.compile(r"main: server is listening on (\S+)")


def listening(srv) -> str:
    return LISTENING.match(srv.wait_for_line("main: server is listening on")).group(1)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    d = tmp_path_factory.mktemp("tls")
    (d / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                  serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    (d / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return d / "key.pem", d / "cert.pem"


def test_tls_with_a_self_signed_certificate(tiny_model, start_server, tls_files):
    key, cert = tls_files
    srv = start_server(tiny_model, "-c", "512", "-np", "1", "--ssl-key-file", str(key),
                       "--ssl-cert-file", str(cert), "--cors-origins", "localhost")
    url = listening(srv)
    assert url == f"https://127.0.0.1:{srv.port}"
    ctx = ssl.create_default_context(cafile=str(cert))
    with httpx.Client(base_url=url, verify=ctx, timeout=30) as client:
        r = client.post("/completion", json={"prompt": "x", "n_predict": 2})
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 2
        assert r.http_version == "HTTP/1.1"
        # --cors-origins localhost: echoed for a localhost origin only
        r = client.get("/health", headers={"Origin": "http://localhost:5173"})
        assert r.headers["access-control-allow-origin"] == "http://localhost:5173"
        r = client.get("/health", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in r.headers
    with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port is no answer
        httpx.get(f"http://127.0.0.1:{srv.port}/health", timeout=5)
    with pytest.raises(httpx.ConnectError):  # and the certificate is really checked
        httpx.get(url + "/health", verify=ssl.create_default_context(), timeout=5)
    srv.stop()


def test_unix_socket_from_a_host_ending_in_sock(tiny_model, start_server, tmp_path):
    path = tmp_path / "mlxcel.sock"
    srv = start_server(tiny_model, "-c", "512", "-np", "1", "--host", str(path))
    assert listening(srv) == f"unix://{path}"
    transport = httpx.HTTPTransport(uds=str(path))
    with httpx.Client(transport=transport, base_url="http://localhost", timeout=30) as client:
        assert client.get("/health").json() == {"status": "ok"}
        r = client.post("/completion", json={"prompt": "x", "n_predict": 2})
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 2
    with pytest.raises(httpx.ConnectError):  # nothing on the TCP port
        httpx.get(f"http://127.0.0.1:{srv.port}/health", timeout=5)
    srv.stop()


@pytest.fixture(scope="module")
def tuned(tiny_model, start_server):
    """--port 0, an API prefix, non-default CORS options, a key, --timeout 2."""
    srv = start_server(tiny_model, "-c", "512", "-np", "1", "--port", "0", "--api-prefix", "/api",
                       "--no-cors-credentials", "--cors-methods", "GET", "--cors-headers", "X-A",
                       "--api-key", KEY, "--timeout", "2")
    srv.url = listening(srv)
    yield srv
    srv.stop()


def test_port_zero_reports_the_real_port(tuned):
    port = int(tuned.url.rsplit(":", 1)[1])
    assert port not in (0, tuned.port)
    assert httpx.get(tuned.url + "/api/health", headers={"Authorization": f"Bearer {KEY}"},
                     timeout=10).status_code == 200


def test_api_prefix_and_cors_options(tuned):
    auth = {"Authorization": f"Bearer {KEY}", "Origin": "https://app.example"}
    assert httpx.get(tuned.url + "/api/props", headers=auth, timeout=10).status_code == 200
    r = httpx.get(tuned.url + "/props", headers=auth, timeout=10)  # not under the prefix
    assert r.status_code == 404
    # upstream compares the full path with its exempt list: a prefixed /health needs the key
    assert httpx.get(tuned.url + "/api/health", timeout=10).status_code == 401
    r = httpx.get(tuned.url + "/api/props", headers={"Origin": "https://app.example"},
                  timeout=10)
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == "*"
    r = httpx.options(tuned.url + "/api/completion", headers={"Origin": "https://app.example"},
                      timeout=10)
    assert r.status_code == 200 and r.text == ""
    assert [(k, v) for k, v in r.headers.items() if k.startswith("access-control")] == [
        ("access-control-allow-origin", "*"), ("access-control-allow-credentials", "false"),
        ("access-control-allow-methods", "GET"), ("access-control-allow-headers", "X-A")]


def test_a_slow_body_is_cut_off_by_the_timeout(tuned):
    host, port = tuned.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=15) as s:
        s.sendall(b"POST /api/completion HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                  KEY.encode() + b"\r\nContent-Length: 1000\r\n\r\n{\"prompt\":")
        start = time.monotonic()
        reply = b""
        while chunk := s.recv(65536):  # the server answers, then closes
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert b'"code":408' in reply and b"Request body not received within 2 seconds" in reply
    assert time.monotonic() - start < 10


def test_a_stream_longer_than_the_timeout_completes(tiny_model, start_server):
    """--timeout bounds each read of a request (the server allows one second
    more, so a silent body gets its 408 first) and each write; once the request
    has arrived the client rightly sends nothing, and a stream that lasts
    several times that limit still delivers its frames in order and the final
    one (a read timeout there would cut the chunked body short)."""
    timeout = 1  # the smallest --timeout accepted
    read_limit = timeout + 1
    srv = start_server(tiny_model, "-c", "32768", "-np", "1", "--timeout", str(timeout))
    # this machine's decode speed, from a first (cold, so slower) request: ask
    # for enough tokens to stream for about three read limits
    r = post(srv.url, {"prompt": "x", "n_predict": 64, "ignore_eos": True}, timeout=120)
    assert r.status_code == 200, r.text
    rate = r.json()["timings"]["predicted_per_second"]
    n_predict = min(30000, max(256, int(rate * 3 * read_limit)))
    frames, arrivals = [], []
    body = {"prompt": "x", "n_predict": n_predict, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", srv.url + "/completion", json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        for line in iter_sse_lines(r):
            if line.startswith("data: "):
                frames.append(json.loads(line[6:]))
                arrivals.append(time.monotonic())
    final = frames[-1]
    assert final["stop"] is True and final["stop_type"] == "limit", final
    assert final["tokens_predicted"] == n_predict
    counts = [f["tokens_predicted"] for f in frames[:-1]]  # the partial frames
    assert counts == sorted(set(counts)) and counts[-1] <= n_predict, "a frame out of order"
    span = arrivals[-1] - arrivals[0]
    assert span > read_limit, (f"the stream of {n_predict} tokens took {span:.2f} s, not more "
                               f"than the {read_limit} s read limit: the test proves nothing")
    srv.stop()


# -- CORS with the defaults (the shared server: no key) ---------------------------

def test_options_on_any_path_is_a_preflight(server):
    for path in ("/completion", "/no/such/path", "/health"):
        r = httpx.options(server.url + path, headers={"Origin": "https://app.example",
                                                      "Access-Control-Request-Method": "POST"},
                          timeout=10)
        assert r.status_code == 200 and r.text == "", path
        assert r.headers["content-type"] == "text/html"
        assert r.headers["server"] == "llama.cpp"
        assert [(k, v) for k, v in r.headers.items() if k.startswith("access-control")] == [
            ("access-control-allow-origin", "https://app.example"),
            ("access-control-allow-credentials", "true"),
            ("access-control-allow-methods", "GET, POST, DELETE, OPTIONS"),
            ("access-control-allow-headers", "*")]


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/health", 200), ("GET", "/props", 200), ("GET", "/nope", 404),
    ("POST", "/completion", 200), ("POST", "/tokenize", 200)])
def test_simple_requests_echo_the_origin_only(server, method, path, status):
    body = {"json": {"prompt": "x", "n_predict": 1, "content": "x"}} if method == "POST" else {}
    r = httpx.request(method, server.url + path, headers={"Origin": "https://app.example"},
                      timeout=30, **body)
    assert r.status_code == status
    cors = {k: v for k, v in r.headers.items() if k.startswith("access-control")}
    assert cors == {"access-control-allow-origin": "https://app.example"}
    r = httpx.request(method, server.url + path, timeout=30, **body)
    assert r.headers["access-control-allow-origin"] == ""  # no Origin: an empty echo


def test_streams_carry_the_header_too(server):
    with httpx.stream("POST", server.url + "/completion", timeout=30,
                      headers={"Origin": "http://x.example"},
                      json={"prompt": "x", "n_predict": 2, "stream": True}) as r:
        assert r.headers["access-control-allow-origin"] == "http://x.example"
        r.read()


def test_header_names_go_out_in_canonical_case(server):
    # upstream's HTTP library writes names as its code spells them; a client
    # that keeps the names as sent (requests' dict(response.headers)) finds them
    r = httpx.get(server.url + "/health", headers={"Origin": "https://app.example"}, timeout=10)
    names = [k for k, _ in r.headers.raw]
    assert b"Access-Control-Allow-Origin" in names and b"Content-Type" in names, names
    assert b"Server" in names and b"Content-Length" in names, names
    # every name the app sends (hypercorn appends its own `date` after it)
    assert all(k == b"-".join(w.capitalize() for w in k.split(b"-"))
               for k in names if k != b"date"), names
    r = httpx.options(server.url + "/completion", headers={"Origin": "https://app.example"},
                      timeout=10)
    assert [k for k, _ in r.headers.raw if k.lower().startswith(b"access-control")] == [
        b"Access-Control-Allow-Origin", b"Access-Control-Allow-Credentials",
        b"Access-Control-Allow-Methods", b"Access-Control-Allow-Headers"]
    with httpx.stream("POST", server.url + "/completion", timeout=30,
                      headers={"Origin": "http://x.example"},
                      json={"prompt": "x", "n_predict": 2, "stream": True}) as r:
        assert (b"Access-Control-Allow-Origin", b"http://x.example") in r.headers.raw
        assert b"Content-Type" in [k for k, _ in r.headers.raw]
        r.read()

"""server/http/cors.py: upstream's Allow-Origin rules."""

from __future__ import annotations

import pytest

from mlxcel_trio.server.http.cors import CorsPolicy, origin_is_localhost


@pytest.mark.parametrize(("policy", "origin", "want"), [
    (CorsPolicy(), "https://a.example", "https://a.example"),   # * + credentials: echo
    (CorsPolicy(), "", ""),                                      # ... empty without one
    (CorsPolicy(credentials=False), "https://a.example", "*"),   # literal otherwise
    (CorsPolicy(origins="https://a.example,https://b.example"), "https://c.example",
     "https://a.example,https://b.example"),                     # a list is sent as given
    (CorsPolicy(origins="localhost"), "http://localhost:3000", "http://localhost:3000"),
    (CorsPolicy(origins="localhost"), "http://127.0.0.1", "http://127.0.0.1"),
    (CorsPolicy(origins="localhost"), "http://[::1]:8080", "http://[::1]:8080"),
    (CorsPolicy(origins="localhost"), "http://localhost.evil.example", None),
    (CorsPolicy(origins="localhost"), "", None),
])
def test_allow_origin(policy, origin, want):
    assert policy.allow_origin(origin) == want


def test_preflight_headers():
    assert CorsPolicy(credentials=False, methods="GET", headers="X-A").preflight() == [
        ("Access-Control-Allow-Credentials", "false"), ("Access-Control-Allow-Methods", "GET"),
        ("Access-Control-Allow-Headers", "X-A")]


def test_unparseable_origin_is_not_localhost():
    assert not origin_is_localhost("http://[bad")

"""Which routes a half-closed client is answered on as upstream's engine
routes (an empty 200 past its one-second poll) and which in full."""

from __future__ import annotations

from mlxcel_trio.protocol.routes import ROUTES
from mlxcel_trio.server.http.half_close import OTHER_GRACE_S, POLL_S, HalfClosePolicy


def test_engine_routes_are_polled_under_the_prefix_and_others_are_not():
    policy = HalfClosePolicy(ROUTES, "/api", extra=[("POST", "/predict")])
    for method, path in (("POST", "/api/completion"), ("POST", "/api/v1/chat/completions"),
                         ("POST", "/api/v1/embeddings"), ("POST", "/api/slots/0"),
                         ("GET", "/api/slots"), ("GET", "/api/metrics"),
                         ("POST", "/api/predict")):
        assert policy.grace_s(method, path) == (POLL_S, True), (method, path)
    for method, path in (("POST", "/completion"), ("GET", "/api/health"),
                         ("POST", "/api/tokenize"), ("GET", "/api/completion"),
                         ("POST", "/api/slots/0/x"), ("GET", "/api/v1/stream")):
        assert policy.grace_s(method, path) == (OTHER_GRACE_S, False), (method, path)

"""Stream-resume soak: many concurrent clients randomly disconnecting,
resuming, cancelling and deleting for a bounded time, then: every slot free,
no session alive past its TTL, resident memory flat.

The TTL and sweep interval are shortened through the internal environment
variables server/sessions/streams.py documents (not options), so "past its TTL" is
checkable within the test's time bound.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from .test_stream_resume import (
    BODIES, GREEDY, TERMINAL, get_cut, lookup, post_cut, slots_idle, wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TTL_S, GC_S = 4.0, 0.5
WARM_S, SOAK_S = 3.0, 8.0
CLIENTS = 12
RSS_BOUND_MIB = 48          # growth allowed between the end of warm-up and the end
ROUTES = ["/completion", "/v1/completions", "/v1/chat/completions", "/v1/messages",
          "/v1/responses"]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


class Client:
    def __init__(self, url: str, seed: int, stop_at: float, ids: set, errors: list,
                 counts: dict) -> None:
        self.url, self.rng, self.stop_at = url, random.Random(seed), stop_at
        self.ids, self.errors, self.counts = ids, errors, counts

    def run(self) -> None:
        try:
            while time.monotonic() < self.stop_at:
                getattr(self, self.rng.choice(
                    ["resume", "resume", "delete", "abandon", "plain_cancel"]))()
        except BaseException as exc:   # surfaced by the test thread
            self.errors.append(repr(exc))

    def _start(self):
        path = self.rng.choice(ROUTES)
        body = dict(BODIES[path], **GREEDY)
        n = self.rng.randint(8, 120)
        for k in ("n_predict", "max_tokens", "max_output_tokens"):
            if k in body:
                body[k] = n
        conv = f"soak-{uuid.uuid4()}"
        self.ids.add(conv)
        first, ended = post_cut(self.url, path, body, conv, self.rng.randint(1, 400))
        return path, conv, first, ended

    def resume(self) -> None:
        t0 = time.monotonic()
        path, conv, have, ended = self._start()
        while not ended:
            try:
                part, ended = get_cut(self.url, conv, len(have), self.rng.randint(50, 3000))
            except AssertionError:
                # swept: only legitimate once the TTL has run since the session
                # could first have ended (it cannot end before it started)
                assert time.monotonic() - t0 > TTL_S, f"{conv} lost before its TTL"
                self.counts["expired"] += 1
                return
            have += part
        assert TERMINAL[path] in have[-3000:], have[-300:]
        r = httpx.get(self.url + "/v1/stream", params={"conv_id": conv}, timeout=30)
        if r.status_code == 200:
            assert r.content == have
        else:
            assert time.monotonic() - t0 > TTL_S, f"{conv} lost before its TTL"
        self.counts["resume"] += 1

    def delete(self) -> None:
        _, conv, _, _ = self._start()
        r = httpx.delete(self.url + "/v1/stream", params={"conv_id": conv}, timeout=30)
        assert r.status_code == 204
        assert lookup(self.url, conv) == []
        self.counts["delete"] += 1

    def abandon(self) -> None:          # never comes back: only the TTL frees it
        self._start()
        self.counts["abandon"] += 1

    def plain_cancel(self) -> None:     # no header: a disconnect cancels the job
        path = self.rng.choice(ROUTES)
        post_cut(self.url, path, dict(BODIES[path], **GREEDY), None, self.rng.randint(1, 300))
        self.counts["plain"] += 1


def _phase(url: str, seconds: float, seed: int, ids: set, counts: dict) -> None:
    errors: list = []
    stop_at = time.monotonic() + seconds
    threads = [threading.Thread(target=Client(url, seed * 100 + i, stop_at, ids, errors,
                                              counts).run) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 60)
        assert not t.is_alive(), "a client hung"
    assert not errors, errors[:3]


def test_soak_leaves_no_slot_no_session_and_flat_memory(tiny_model, start_server):
    srv = start_server(tiny_model, "-c", "16384", "-np", "4", env={
        "MLXCEL_INTERNAL_STREAM_TTL_S": str(TTL_S), "MLXCEL_INTERNAL_STREAM_GC_S": str(GC_S)})
    try:
        ids: set = set()
        counts = {"resume": 0, "delete": 0, "abandon": 0, "plain": 0, "expired": 0}
        _phase(srv.url, WARM_S, 1, ids, counts)
        wait_for("every slot idle after warm-up", lambda: slots_idle(srv.url), 15)
        rss_warm = rss_mib(srv.proc.pid)
        _phase(srv.url, SOAK_S, 2, ids, counts)
        wait_for("every slot idle", lambda: slots_idle(srv.url), 15)
        done_at = time.monotonic()
        # nothing survives its TTL (plus one sweep and some slack)
        wait_for("every session swept", lambda: lookup(srv.url, *ids) == [], TTL_S + 2 * GC_S + 5)
        swept_after = time.monotonic() - done_at
        rss_end = rss_mib(srv.proc.pid)
        print(f"\nsoak: {counts}, {len(ids)} sessions, swept {swept_after:.1f}s after idle, "
              f"RSS {rss_warm:.0f} -> {rss_end:.0f} MiB")
        assert min(v for k, v in counts.items() if k != "expired") > 0, counts
        assert rss_end - rss_warm < RSS_BOUND_MIB, (rss_warm, rss_end)
        assert httpx.get(srv.url + "/health", timeout=10).status_code == 200
    finally:
        srv.stop()

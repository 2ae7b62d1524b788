"""The request watchdog (server/http/watchdog.py): a request without
progress past the bound is logged once with its task stack and counted in
/metrics; one that moves is not, and neither is ended by it."""

from __future__ import annotations

import logging
import time

import pytest
import trio

from mlxcel_trio.server.http.watchdog import WATCHDOG_ENV

from .fake_engine import reply

BOUND_S = 0.3
WAIT_S = 10.0


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics:\n{text}")


async def _stalled(s) -> tuple[float, float]:
    text = (await (await s.get("/metrics")).get_data()).decode()
    return (_metric(text, "mlxcel_requests_stalled_total"),
            _metric(text, "mlxcel_requests_stalled_now"))


@pytest.fixture
def short_bound(monkeypatch):
    monkeypatch.setenv(WATCHDOG_ENV, str(BOUND_S))


@pytest.mark.route("POST /completion", "GET /metrics")
async def test_a_request_without_progress_is_reported_once(serve, short_bound, caplog):
    # the engine admits the job, decodes one token, then holds it: no event, no byte
    s = await serve("--metrics", script=reply("a long answer", hold_after=1))
    caplog.set_level(logging.WARNING, logger="mlxcel.watchdog")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(s.post, "/completion", {"prompt": "hi", "n_predict": 8})
        with trio.fail_after(WAIT_S):
            while await _stalled(s) != (1, 1):
                await trio.sleep(BOUND_S / 4)
        # several more bounds pass: still one report, the request still open
        await trio.sleep(3 * BOUND_S)
        assert await _stalled(s) == (1, 1)
        nursery.cancel_scope.cancel()
    reports = [r for r in caplog.records if r.name == "mlxcel.watchdog"]
    assert len(reports) == 1, [r.getMessage() for r in reports]
    text = reports[0].getMessage()
    assert text.startswith("request POST /completion: no progress for")
    assert "run_all" in text, text   # the await stack names where it waits
    with trio.fail_after(WAIT_S):  # once it ended it is no longer stalled
        while (await _stalled(s))[1] != 0:
            await trio.sleep(BOUND_S / 4)


@pytest.mark.route("POST /completion", "GET /metrics")
async def test_a_moving_request_is_not_reported(serve, short_bound, caplog):
    s = await serve("--metrics")
    caplog.set_level(logging.WARNING, logger="mlxcel.watchdog")
    # slower than the bound in total, but each step is progress
    slow = reply("x " * 40)

    def paced(job, slot, vocab):  # runs on the engine thread: a slow engine
        for step in slow(job, slot, vocab):
            time.sleep(BOUND_S / 6)
            yield step

    s.engine.script = paced
    r = await s.post("/completion", {"prompt": "hi", "n_predict": 30})
    assert r.status_code == 200
    assert await _stalled(s) == (0, 0)
    assert not [r for r in caplog.records if r.name == "mlxcel.watchdog"]

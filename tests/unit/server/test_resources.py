"""server/http/resources.py: what a request holds until it ends."""

from __future__ import annotations

import pytest

from mlxcel_trio.server.http.resources import RequestResources


class _Handle:
    def __init__(self, log: list | None = None, name: str = "") -> None:
        self.closed = 0
        self.log, self.name = log, name

    def close(self) -> None:
        self.closed += 1
        if self.log is not None:
            self.log.append(self.name)


def test_close_runs_every_closer_once_newest_first():
    order: list[str] = []
    res = RequestResources()
    a, b = res.own(_Handle(order, "a")), res.own(_Handle(order, "b"))
    res.on_close(lambda: order.append("cb"))
    assert len(res) == 3
    res.close()
    res.close()                          # idempotent
    assert order == ["cb", "b", "a"] and a.closed == b.closed == 1 and len(res) == 0


def test_detach_hands_a_resource_to_its_new_owner():
    res = RequestResources()
    kept, moved = res.own(_Handle()), res.own(_Handle())
    res.detach(moved)
    res.detach(moved)                    # taking it twice is harmless
    res.detach(_Handle())                # so is one it never held
    res.close()
    assert kept.closed == 1 and moved.closed == 0


def test_registering_after_the_end_closes_at_once():
    res = RequestResources()
    res.close()
    late = res.own(_Handle())
    assert late.closed == 1 and res.closed


def test_a_failing_closer_does_not_skip_the_others():
    res = RequestResources()
    first = res.own(_Handle())

    def boom() -> None:
        raise RuntimeError("boom")

    res.on_close(boom)
    last = res.own(_Handle())
    with pytest.raises(RuntimeError, match="boom"):
        res.close()
    assert first.closed == last.closed == 1

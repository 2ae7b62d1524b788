"""server/sessions/control.py: the registry of controllable completions and
the control route's answers, without a server."""

from __future__ import annotations

import json

import pytest

from mlxcel_trio.server.http.errors import ApiError
from mlxcel_trio.server.http.resources import RequestResources
from mlxcel_trio.server.sessions.control import ControlRegistry


class _Bridge:
    """Records the force-end commands the registry posts."""

    def __init__(self) -> None:
        self.forced: list[tuple[int, ...]] = []

    def force_end(self, job_ids) -> None:
        self.forced.append(tuple(job_ids))


def _registry() -> ControlRegistry:
    return ControlRegistry(_Bridge())


class _Handle:
    """A stream's jobs: live until `end()`."""

    def __init__(self) -> None:
        self.running = True

    def live(self) -> bool:
        return self.running

    def end(self) -> None:
        self.running = False


async def _answer(resp) -> dict:
    return json.loads(await resp.get_data())


async def test_a_non_streamed_completion_lives_until_its_request_ends():
    bridge, request = _Bridge(), RequestResources()
    reg = ControlRegistry(bridge)
    reg.register("chatcmpl-a", "0", (7, 8), request=request)
    assert reg.find("chatcmpl-a", "0") is not None
    assert await _answer(await reg.control({"id": "chatcmpl-a", "action": "reasoning_end"}, "0")) \
        == {"success": True}
    assert bridge.forced == [(7, 8)]
    request.close()
    assert reg.find("chatcmpl-a", "0") is None and len(reg) == 0


async def test_a_streamed_completion_lives_while_its_jobs_run():
    reg, handle = _registry(), _Handle()
    reg.register("chatcmpl-s", "0", (1,), handle=handle)
    assert reg.find("chatcmpl-s", "0") is not None
    handle.end()
    assert reg.find("chatcmpl-s", "0") is None
    # a finished entry is also swept by the next registration
    other = _Handle()
    reg.register("chatcmpl-t", "0", None, handle=other)
    other.end()
    reg.register("chatcmpl-u", "0", None, request=RequestResources())
    assert len(reg) == 1


async def test_the_routes_answers_in_upstreams_order():
    reg = _registry()
    reg.register("chatcmpl-off", "0", None, request=RequestResources())
    with pytest.raises(ApiError, match="missing completion id"):
        await reg.control({"action": "nope"}, "0")
    with pytest.raises(ApiError, match="unknown control action"):
        await reg.control({"id": "chatcmpl-off", "action": "nope"}, "0")
    assert await _answer(await reg.control(
        {"id": "chatcmpl-x", "action": "reasoning_end"}, "0")) \
        == {"success": False, "message": "no active completion for this id"}
    assert await _answer(await reg.control(
        {"id": "chatcmpl-off", "action": "reasoning_end"}, "0")) \
        == {"success": False, "message": "reasoning control not enabled for this completion"}
    # another API key's completion is an unknown id
    assert await _answer(await reg.control(
        {"id": "chatcmpl-off", "action": "reasoning_end"}, "1")) \
        == {"success": False, "message": "no active completion for this id"}


def test_each_app_has_its_own_registry():
    one, two = _registry(), _registry()
    one.register("chatcmpl-a", "0", None, request=RequestResources())
    assert one.find("chatcmpl-a", "0") is not None and two.find("chatcmpl-a", "0") is None

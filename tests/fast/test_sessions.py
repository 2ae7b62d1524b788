"""Stream sessions (X-Conversation-Id, GET/DELETE /v1/stream, POST
/v1/streams/lookup) and slot files (POST /slots/:id_slot) in-process
(server/sessions/streams.py, server/sessions/slot_files.py)."""

from __future__ import annotations

import pytest

from mlxcel_trio.protocol.records import Cancel, Submit

from .conftest import JSON_TYPE, SSE_TYPE, error_of
from .fake_engine import reply

route = pytest.mark.route
HEADER = "X-Conversation-Id"
BODY = {"prompt": "x", "stream": True}
NOT_FOUND = {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}
MISSING_ID = "Missing conversation id in path"


@route("GET /v1/stream", "POST /v1/streams/lookup", "POST /completion")
async def test_a_session_replays_its_bytes_from_any_offset(serve):
    s = await serve(script=reply("resumable text"))
    first = await s.sse("/completion", BODY, headers={HEADER: "conv-1"})
    assert first.status_code == 200 and first.headers["Content-Type"] == SSE_TYPE
    whole = first.body
    replay = await s.sse("/v1/stream?conv_id=conv-1&from=0", None, method="GET")
    assert replay.status_code == 200 and replay.headers["Content-Type"] == SSE_TYPE
    assert replay.body == whole
    tail = await s.sse(f"/v1/stream?conv_id=conv-1&from={len(whole) - 10}", None, method="GET")
    assert tail.body == whole[-10:]
    r = await s.post("/v1/streams/lookup", {"conversation_ids": ["conv-1", "nope"]})
    assert r.status_code == 200 and r.content_type == JSON_TYPE
    (entry,) = await r.get_json()
    assert set(entry) == {"conversation_id", "is_done", "total_bytes", "started_at",
                          "completed_at"}
    assert entry["conversation_id"] == "conv-1" and entry["is_done"] is True
    assert entry["total_bytes"] == len(whole)


@route("GET /v1/stream", "DELETE /v1/stream")
async def test_stream_route_errors(serve):
    s = await serve()
    r = await s.get("/v1/stream")
    assert error_of(await r.get_json(), 400, "invalid_request_error") == MISSING_ID
    r = await s.get("/v1/stream?conv_id=never")
    assert r.status_code == 404 and await r.get_json() == NOT_FOUND
    r = await s.open("/v1/stream?conv_id=", method="DELETE")
    assert error_of(await r.get_json(), 400, "invalid_request_error") == MISSING_ID


@route("POST /v1/streams/lookup")
async def test_lookup_tolerates_junk(serve):
    s = await serve()
    for body in ({}, {"conversation_ids": "x"}, {"conversation_ids": [1, "", None]}, []):
        r = await s.post("/v1/streams/lookup", body)
        assert await r.get_json() == []
    r = await s.post("/v1/streams/lookup", raw=b"{")
    err = (await r.get_json())["error"]
    assert r.status_code == 400 and set(err) == {"message", "type"}
    assert err["message"].startswith("invalid body: [json.exception.parse_error")


@route("DELETE /v1/stream", "POST /completion")
async def test_delete_stops_a_live_session(serve):
    s = await serve(script=reply("never finishes", hold_after=1))

    async def stop(chunks: list[bytes]) -> None:
        r = await s.open("/v1/stream?conv_id=live", method="DELETE")
        assert r.status_code == 204 and await r.get_data() == b""

    await s.read_then_disconnect("/completion", BODY, headers={HEADER: "live"},
                                 meanwhile=stop)
    submit = await s.next_command()
    assert isinstance(submit, Submit)
    assert await s.next_command() == Cancel(submit.job.id)
    r = await s.open("/v1/stream?conv_id=live", method="DELETE")
    assert r.status_code == 204   # idempotent


@route("POST /completion")
async def test_a_bad_conversation_id_is_refused(serve):
    s = await serve()
    r = await s.post("/completion", {"prompt": "x", "stream": True},
                     headers={HEADER: "a b"})
    assert HEADER in error_of(await r.get_json(), 400, "invalid_request_error")


# -- slot files ------------------------------------------------------------------------------

@route("POST /slots/:id_slot")
async def test_slot_actions_need_a_save_path(serve):
    s = await serve()
    r = await s.post("/slots/0?action=save", {"filename": "a.bin"})
    assert error_of(await r.get_json(), 501, "not_supported_error") == (
        "This server does not support slots action. Start it with `--slot-save-path`")


@route("POST /slots/:id_slot", "POST /completion")
async def test_save_erase_restore(serve, tmp_path):
    s = await serve("--slot-save-path", str(tmp_path), "-np", "1", script=reply("ab"))
    assert (await s.post("/completion", {"prompt": "x", "n_predict": 2})).status_code == 200
    r = await s.post("/slots/0?action=save", {"filename": "slot.bin"})
    assert r.status_code == 200 and r.content_type == JSON_TYPE
    saved = await r.get_json()
    assert set(saved) == {"id_slot", "filename", "n_saved", "n_written", "timings"}
    assert saved["filename"] == "slot.bin" and saved["n_saved"] == 3
    r = await s.post("/slots/0?action=erase", {})
    assert await r.get_json() == {"id_slot": 0, "n_erased": 3}
    r = await s.post("/slots/0?action=restore", {"filename": "slot.bin"})
    restored = await r.get_json()
    assert set(restored) == {"id_slot", "filename", "n_restored", "n_read", "timings"}
    assert restored["n_restored"] == 3


@route("POST /slots/:id_slot")
@pytest.mark.parametrize("path,body,message", [
    ("/slots/x?action=save", {"filename": "a"}, "Invalid slot ID"),
    ("/slots/0?action=fly", {"filename": "a"}, "Invalid action"),
    ("/slots/0?action=save", {"filename": "../a"}, "Invalid filename"),
    ("/slots/5?action=erase", {}, "Invalid slot ID"),   # the engine's answer
])
async def test_slot_action_errors(serve, tmp_path, path, body, message):
    s = await serve("--slot-save-path", str(tmp_path), "-np", "1")
    r = await s.post(path, body)
    assert error_of(await r.get_json(), 400, "invalid_request_error") == message


@route("POST /slots/:id_slot")
async def test_a_missing_filename_is_upstreams_500(serve, tmp_path):
    s = await serve("--slot-save-path", str(tmp_path))
    r = await s.post("/slots/0?action=save", {})
    assert error_of(await r.get_json(), 500, "server_error") == (
        "[json.exception.out_of_range.403] key 'filename' not found")

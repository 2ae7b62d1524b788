"""POST /slots/:id_slot?action=save|restore|erase with --slot-save-path."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from tests.conftest import wait_until

from .sse import iter_sse_lines, post

pytestmark = pytest.mark.e2e

GREEDY = {"temperature": 0.0, "seed": 1}


@pytest.fixture(scope="module")
def save_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def slot_server(tiny_model, start_server, save_dir):
    srv = start_server(tiny_model, "-c", "2048", "-np", "2", "--slot-save-path", str(save_dir))
    yield srv
    srv.stop()


def action(srv, slot, act, body=None):
    return post(srv.url, body if body is not None else {}, path=f"/slots/{slot}?action={act}")


def err(r, status, message, kind="invalid_request_error"):
    assert r.status_code == status, r.text
    assert r.json() == {"error": {"code": status, "message": message, "type": kind}}


def wait_idle(srv, slot, timeout=60.0):
    wait_until(lambda: httpx.get(srv.url + "/slots", timeout=10).json(),
               f"slot {slot} idle", timeout, until=lambda slots: not slots[slot]["is_processing"])


def fill(srv, slot, text="slot files hold the token stream", n=6):
    j = post(srv.url, {"prompt": text, "n_predict": n, "id_slot": slot, **GREEDY}).json()
    assert j["id_slot"] == slot
    return j


def test_save_erase_restore_round_trip(slot_server, save_dir):
    j = fill(slot_server, 0)
    n_tokens = j["tokens_evaluated"] + j["tokens_predicted"]
    r = action(slot_server, 0, "save", {"filename": "a.slot"})
    assert r.status_code == 200, r.text
    saved = r.json()
    assert list(saved) == ["id_slot", "filename", "n_saved", "n_written", "timings"]
    assert saved["id_slot"] == 0 and saved["filename"] == "a.slot"
    assert saved["n_saved"] == n_tokens
    path = save_dir / "a.slot"
    assert saved["n_written"] == path.stat().st_size > 0
    assert set(saved["timings"]) == {"save_ms"}
    assert not [p for p in os.listdir(save_dir) if p.endswith(".tmp")]  # atomic: no leftovers
    doc = json.loads(path.read_text())
    assert len(doc["tokens"]) == n_tokens and doc["model"] and doc["tokenizer"]

    r = action(slot_server, 0, "erase")
    assert r.status_code == 200 and r.json() == {"id_slot": 0, "n_erased": n_tokens}
    assert action(slot_server, 0, "erase").json() == {"id_slot": 0, "n_erased": 0}

    r = action(slot_server, 1, "restore", {"filename": "a.slot"})
    assert r.status_code == 200, r.text
    restored = r.json()
    assert list(restored) == ["id_slot", "filename", "n_restored", "n_read", "timings"]
    assert restored["n_restored"] == n_tokens
    assert restored["n_read"] == path.stat().st_size
    assert set(restored["timings"]) == {"restore_ms"}
    wait_idle(slot_server, 1)  # the slot re-evaluates the restored tokens first
    # the restored stream is the slot's: saving it again writes the same tokens
    again = action(slot_server, 1, "save", {"filename": "b.slot"}).json()
    assert again["n_saved"] == n_tokens
    assert json.loads((save_dir / "b.slot").read_text())["tokens"] == doc["tokens"]


@pytest.mark.parametrize("name", ["", "../escape", "a/b", "a\\b", "..", ".", "x.", " x", "x ",
                                  "a:b", "a*b", "a?b", 'a"b', "a<b", "a>b", "a|b", "a\u0001b",
                                  "a\u2215b", "a\uff0eb", "\ufeffa", "a" * 256, "..hidden"])
@pytest.mark.parametrize("act", ["save", "restore"])
def test_invalid_filenames_are_refused(slot_server, save_dir, name, act):
    err(action(slot_server, 0, act, {"filename": name}), 400, "Invalid filename")
    assert not (save_dir.parent / "escape").exists()


def test_unicode_filename_within_rules_is_accepted(slot_server, save_dir):
    fill(slot_server, 0)
    r = action(slot_server, 0, "save", {"filename": "café-slot.bin"})
    assert r.status_code == 200, r.text
    assert (save_dir / "café-slot.bin").is_file()


def test_symlink_escape_is_refused(slot_server, save_dir, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    (save_dir / "link.slot").symlink_to(outside)
    for act in ("save", "restore"):
        err(action(slot_server, 0, act, {"filename": "link.slot"}), 400, "Invalid filename")
    assert outside.read_text() == "precious"


def test_restore_refusals(slot_server, save_dir):
    prefix = "Unable to restore slot: "
    err(action(slot_server, 0, "restore", {"filename": "missing.slot"}), 400,
        prefix + "No available space in KV cache or invalid slot save file")
    (save_dir / "junk.slot").write_text("not a slot file")
    err(action(slot_server, 0, "restore", {"filename": "junk.slot"}), 400,
        prefix + "No available space in KV cache or invalid slot save file")
    # a file written for another model or tokenizer is bound to them
    fill(slot_server, 0)
    action(slot_server, 0, "save", {"filename": "bound.slot"})
    doc = json.loads((save_dir / "bound.slot").read_text())
    (save_dir / "other.slot").write_text(json.dumps({**doc, "tokenizer": "0" * 64}))
    err(action(slot_server, 0, "restore", {"filename": "other.slot"}), 400,
        prefix + "No available space in KV cache or invalid slot save file")
    (save_dir / "badtok.slot").write_text(json.dumps({**doc, "tokens": [5, 10**9]}))
    err(action(slot_server, 0, "restore", {"filename": "badtok.slot"}), 400,
        prefix + "Invalid tokens in slot save file")
    (save_dir / "long.slot").write_text(json.dumps({**doc, "tokens": [5] * 5000}))
    err(action(slot_server, 0, "restore", {"filename": "long.slot"}), 400,
        prefix + "Restored prompt does not fit in the slot context")


def test_restore_of_a_directory_or_fifo_is_refused(slot_server, save_dir):
    """Something not a regular file under the name is an invalid slot file:
    a 400, not a 500 (directory) or a request that never answers (FIFO)."""
    (save_dir / "dir.slot").mkdir()
    os.mkfifo(save_dir / "fifo.slot")
    for name in ("dir.slot", "fifo.slot"):
        err(action(slot_server, 0, "restore", {"filename": name}), 400,
            "Unable to restore slot: No available space in KV cache or invalid slot save file")
    assert httpx.get(slot_server.url + "/health").status_code == 200


def test_slot_id_action_and_body_refusals(slot_server):
    err(action(slot_server, "abc", "erase"), 400, "Invalid slot ID")
    err(action(slot_server, 7, "erase"), 400, "Invalid slot ID")
    err(action(slot_server, -1, "save", {"filename": "x"}), 400, "Invalid slot ID")
    err(action(slot_server, 0, "delete"), 400, "Invalid action")
    err(post(slot_server.url, {}, path="/slots/0"), 400, "Invalid action")
    err(action(slot_server, 0, "save", {}), 500,
        "[json.exception.out_of_range.403] key 'filename' not found", "server_error")
    err(action(slot_server, 0, "save", {"filename": 3}), 500,
        "[json.exception.type_error.302] type must be string, but is number", "server_error")


def test_busy_slot_answers_503(slot_server):
    body = {"prompt": "keep the slot busy", "n_predict": 400, "id_slot": 0, "stream": True,
            "ignore_eos": True, **GREEDY}
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", slot_server.url + "/completion", json=body) as r:
            lines = iter_sse_lines(r)
            next(line for line in lines if line.startswith("data: "))  # the slot is held now
            for act, b in (("save", {"filename": "busy.slot"}), ("restore",
                           {"filename": "busy.slot"}), ("erase", None)):
                res = action(slot_server, 0, act, b)
                assert res.status_code == 503, res.text
                assert res.json()["error"]["type"] == "unavailable_error"
            # the other slot is free to act on
            assert action(slot_server, 1, "erase").status_code == 200


def test_slot_save_path_must_be_a_directory(tiny_model, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    for value in (str(f), str(tmp_path / "absent")):
        p = subprocess.run([sys.executable, "-m", "mlxcel_trio", "-m", str(tiny_model),
                            "--slot-save-path", value], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 1
        assert f"--slot-save-path: not a directory: {value}" in p.stderr


def test_restore_refills_the_prompt_cache(tiny_model, start_server, slot_server, save_dir):
    """A restore on a fresh server re-evaluates the tokens into the prompt
    cache: the next request that starts with them adopts them."""
    fill(slot_server, 0, text="a restored conversation carries on from here", n=5)
    action(slot_server, 0, "save", {"filename": "warm.slot"})
    tokens = json.loads((save_dir / "warm.slot").read_text())["tokens"]
    fresh = start_server(tiny_model, "-c", "2048", "-np", "2", "--slot-save-path", str(save_dir))
    try:
        r = action(fresh, 0, "restore", {"filename": "warm.slot"})
        assert r.status_code == 200, r.text
        # id_slot 0 queues behind the slot's refill
        j = post(fresh.url, {"prompt": tokens + [42, 43], "n_predict": 2, "id_slot": 0,
                             **GREEDY}).json()
        assert j["timings"]["cache_n"] >= len(tokens)
        cold = post(fresh.url, {"prompt": tokens + [42, 43], "n_predict": 2, "id_slot": 0,
                                "cache_prompt": False, **GREEDY}).json()
        assert cold["content"] == j["content"]
    finally:
        fresh.stop()

"""server/sessions/response_store.py: bounded in count and bytes, oldest-stored
evicted first, a running background response never evicted, scoped keys."""

from __future__ import annotations

from mlxcel_trio.server.sessions.response_store import ResponseStore, Stored


def stored(text: str = "x", status: str = "completed", background: bool = False) -> Stored:
    return Stored({"status": status, "text": text}, [{"role": "user", "content": text}],
                  background)


def test_count_bound_evicts_the_oldest_stored():
    store = ResponseStore(max_responses=3)
    for i in range(5):
        store.put("", f"r{i}", stored())
    assert len(store) == 3
    assert [store.get("", f"r{i}") is not None for i in range(5)] == [False, False, True, True,
                                                                       True]
    store.get("", "r2")  # reading does not refresh
    store.put("", "r5", stored())
    assert store.get("", "r2") is None and store.get("", "r3") is not None


def test_byte_bound_and_an_oversized_response():
    one = stored("a" * 100)
    store = ResponseStore(max_bytes=3 * 140)
    for i in range(4):
        assert store.put("", f"r{i}", stored("a" * 100))
    assert store.bytes <= 3 * 140 and len(store) < 4 and store.get("", "r3") is not None
    assert not store.put("", "big", stored("a" * 1000))
    assert store.get("", "big") is None
    assert one.size == 0  # sized only when stored


def test_a_running_background_response_is_never_evicted():
    store = ResponseStore(max_responses=2)
    store.put("", "bg", stored(status="in_progress", background=True))
    for i in range(4):
        store.put("", f"r{i}", stored())
    assert store.get("", "bg") is not None and store.live_background() == 1


def test_scopes_do_not_see_each_other():
    store = ResponseStore()
    store.put("key-a", "r", stored())
    assert store.get("key-b", "r") is None and store.get("key-a", "r") is not None


def test_replacing_keeps_the_byte_count_exact():
    store = ResponseStore()
    store.put("", "r", stored("a" * 50))
    before = store.bytes
    store.put("", "r", stored("a" * 50))
    assert store.bytes == before and len(store) == 1

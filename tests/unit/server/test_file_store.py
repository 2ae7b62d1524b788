"""server/sessions/file_store.py on a real directory: a session's log
(open record, chunks with their token ids, claims, end), what a restarted
server reads back (retained bytes, ids per job, a torn last record
ignored), compaction past twice the byte cap, removal on drop, ended logs
past their retention deleted at startup, and the one-server lock."""

from __future__ import annotations

import os

import pytest
import trio

from mlxcel_trio.server.sessions.file_store import FileStore, read_log

BOUND_S = 10.0


def make(tmp_path, max_bytes: int = 1 << 20, ttl: float = 300.0) -> FileStore:
    return FileStore(f"file://{tmp_path}", stream_ttl_s=ttl, max_bytes=max_bytes)


async def flushed(store: FileStore, gen: str, start: int, data: bytes, **kw) -> bool:
    done, result = trio.Event(), []

    def then(ok: bool) -> None:
        result.append(ok)
        done.set()
    store.queue(gen, 0, "c1", start, data, then=then, **kw)
    with trio.fail_after(BOUND_S):
        await done.wait()
    return result[0]


async def test_a_log_reads_back_as_the_session_it_recorded(tmp_path):
    store = make(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        gen, replaced = await store.open_stream(0, "c1", {"path": "/completion"})
        assert replaced is None
        assert await flushed(store, gen, 0, b"data: a\n\n", tokens=[[5, 6]])
        assert await flushed(store, gen, 9, b"data: b\n\n", tokens=[[7]])
        nursery.cancel_scope.cancel()
    (name,) = [n for n in os.listdir(tmp_path) if n.endswith(".log")]
    rec = read_log(str(tmp_path / name), 1 << 20)
    assert (rec.cid, rec.gen, rec.request, rec.done) == ("c1", gen, {"path": "/completion"}, False)
    assert bytes(rec.data) == b"data: a\n\ndata: b\n\n" and rec.first == 0
    assert rec.tokens == [[5, 6, 7]]
    # a torn last record (the process died mid-write) is ignored
    with open(tmp_path / name, "ab") as f:
        f.write(b'{"k":"d","n":100,"at":18}\npartial')
    assert bytes(read_log(str(tmp_path / name), 1 << 20).data) == bytes(rec.data)
    # a restarted server recovers it, unfinished, and counts its claims
    again = make(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(again.run)
        (back,) = again.recovered()
        assert back.total == 18 and not back.done
        assert again.claim(back) == 1
        assert await flushed(again, back.gen, back.total, b"data: c\n\n", tokens=[[8]],
                             end=True)
        nursery.cancel_scope.cancel()
    rec = read_log(str(tmp_path / name), 1 << 20)
    assert rec.done and rec.attempts == 1 and rec.tokens == [[5, 6, 7, 8]]
    assert bytes(rec.data).endswith(b"data: c\n\n")


async def test_a_log_is_compacted_past_twice_the_cap_and_removed_on_drop(tmp_path):
    cap = 1000
    store = make(tmp_path, max_bytes=cap)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        gen, _ = await store.open_stream(0, "c1")
        offset = 0
        for i in range(200):
            chunk = b"x" * 500
            assert await flushed(store, gen, offset, chunk, tokens=[[i]])
            offset += len(chunk)
        (name,) = [n for n in os.listdir(tmp_path) if n.endswith(".log")]
        assert os.path.getsize(tmp_path / name) < 2 * cap + 65536 + 2000
        rec = read_log(str(tmp_path / name), cap)
        assert rec.total == offset and len(rec.data) == cap and rec.tokens == [list(range(200))]
        assert await flushed(store, gen, offset, b"", drop=True)
        assert not [n for n in os.listdir(tmp_path) if n.endswith(".log")]
        nursery.cancel_scope.cancel()


async def test_ended_logs_past_their_retention_are_deleted_at_startup(tmp_path):
    store = make(tmp_path, ttl=0.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        gen, _ = await store.open_stream(0, "c1")
        assert await flushed(store, gen, 0, b"data: a\n\n", end=True)
        nursery.cancel_scope.cancel()
    again = make(tmp_path, ttl=0.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(again.run)
        assert again.recovered() == []
        nursery.cancel_scope.cancel()
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".log")]


async def test_one_server_per_directory(tmp_path):
    store = make(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        with pytest.raises(RuntimeError, match="another server uses this directory"):
            await make(tmp_path).run()
        nursery.cancel_scope.cancel()

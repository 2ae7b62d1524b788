"""The slot context bound on a real server: admission refusal with upstream's
wording, the stop at the bound without --context-shift, and shifting past it
with upstream's n_keep / n_discard arithmetic (read back from the server's
own "slot context shift" lines).  -c 128 -np 2 gives 64-token slots.  Last,
upstream's cap of a slot at the model's training context, on a checkpoint
whose config claims a short one."""

from __future__ import annotations

import re

import pytest

from mlxcel_trio.engine.context_shift import window
from tests.conftest import wait_until
from tests.e2e.sse import post, stream_frames

N_CTX_SLOT = 64
GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def bounded(tiny_model):
    from tests.conftest import ServerProcess

    srv = ServerProcess(tiny_model, "-c", "128", "-np", "2", "--no-warmup").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def shifting(tiny_model):
    from tests.conftest import ServerProcess

    srv = ServerProcess(tiny_model, "-c", "128", "-np", "2", "--no-warmup",
                        "--context-shift", "--keep", "4").start()
    yield srv
    srv.stop()


def _overflow(r, n: int | None = None) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "exceed_context_size_error" and err["code"] == 400
    assert err["n_ctx"] == N_CTX_SLOT and err["n_prompt_tokens"] >= N_CTX_SLOT
    if n is not None:
        assert err["n_prompt_tokens"] == n
    assert err["message"] == (f"request ({err['n_prompt_tokens']} tokens) exceeds the "
                              f"available context size ({N_CTX_SLOT} tokens), try increasing it")


@pytest.mark.parametrize("srv", ["bounded", "shifting"])
def test_a_prompt_that_cannot_fit_is_refused_on_every_route(request, srv):
    server = request.getfixturevalue(srv)
    _overflow(post(server.url, {"prompt": [5] * 64}), 64)
    _overflow(post(server.url, {"prompt": [5] * 64, "max_tokens": 4}, path="/v1/completions"),
              64)
    chat = {"messages": [{"role": "user", "content": "word " * 80}], "max_tokens": 4}
    _overflow(post(server.url, chat, path="/v1/chat/completions"))
    # one below the bound is admitted
    assert post(server.url, {"prompt": [5] * 63, "n_predict": 4}).status_code == 200


def test_without_shift_generation_stops_at_the_bound(bounded):
    res = post(bounded.url, {"prompt": [5] * 40, "n_predict": -1, **GREEDY}).json()
    assert res["tokens_predicted"] == N_CTX_SLOT - 40
    assert res["stop_type"] == "limit" and res["truncated"] is True
    frames, _ = stream_frames(bounded.url, {"prompt": [5] * 40, "n_predict": 100, **GREEDY})
    assert frames[-1]["stop"] is True and frames[-1]["truncated"] is True
    assert frames[-1]["tokens_predicted"] == N_CTX_SLOT - 40
    oa = post(bounded.url, {"prompt": [5] * 40, "max_tokens": 100, **GREEDY},
              path="/v1/completions").json()
    assert oa["choices"][0]["finish_reason"] == "length"
    assert oa["usage"]["completion_tokens"] == N_CTX_SLOT - 40
    chat = post(bounded.url, {"messages": [{"role": "user", "content": "hello " * 5}],
                              "max_tokens": 200, **GREEDY}, path="/v1/chat/completions").json()
    assert chat["choices"][0]["finish_reason"] == "length"
    assert chat["usage"]["prompt_tokens"] + chat["usage"]["completion_tokens"] == N_CTX_SLOT


SHIFT_LINE = re.compile(r"task (\d+) \| slot context shift, n_keep = (\d+), n_left = (\d+), "
                        r"n_discard = (\d+)")


def _expected_shifts(n_prompt: int, n_predict: int, n_keep: int, n_discard: int):
    """Upstream's pre_decode, simulated: KV cells before each decode."""
    out, cells = [], n_prompt
    for _ in range(n_predict - 1):      # the last token is never decoded
        if cells + 1 >= N_CTX_SLOT:
            keep, discard = window(cells, N_CTX_SLOT, n_keep, n_discard, n_prompt, False)
            out.append((keep, cells - keep, discard))
            cells -= discard
        cells += 1
    return out


def _shifts(server):
    lines = "".join(server.stdout + server.stderr)
    return [tuple(map(int, m.groups())) for m in SHIFT_LINE.finditer(lines)]


@pytest.mark.parametrize("fields, n_keep, n_discard", [
    ({}, 4, 0),                                   # --keep 4, half the rest
    ({"n_keep": -1}, -1, 0),                      # the whole prompt
    ({"n_keep": 0, "n_discard": 7}, 0, 7),
    ({"n_keep": 2, "n_discard": 1000}, 2, 1000),  # clamped to n_left - 1
])
def test_shift_runs_past_the_bound_as_upstream(shifting, fields, n_keep, n_discard):
    prompt = list(range(100, 110))
    before = len(_shifts(shifting))
    res = post(shifting.url, {"prompt": prompt, "n_predict": 150, **GREEDY, **fields}).json()
    assert res["tokens_predicted"] == 150                       # past the 64-token bound
    assert res["stop_type"] == "limit" and res["truncated"] is True
    assert res["tokens_evaluated"] == len(prompt)
    assert res["generation_settings"]["n_keep"] == n_keep
    assert res["generation_settings"]["n_discard"] == n_discard
    want = _expected_shifts(len(prompt), 150, n_keep, n_discard)
    # The log lines come through a reader thread, which may still be behind
    # the response: wait (bounded) until as many lines as expected are read.
    got = wait_until(lambda: [s[1:] for s in _shifts(shifting)[before:]],
                     "the server's context shift lines", until=lambda g: len(g) >= len(want))
    assert got == want


def test_shift_on_the_openai_and_chat_routes(shifting):
    oa = post(shifting.url, {"prompt": "hello " * 10, "max_tokens": 120, **GREEDY},
              path="/v1/completions").json()
    assert oa["choices"][0]["finish_reason"] == "length"
    assert oa["usage"]["completion_tokens"] == 120
    chat = post(shifting.url, {"messages": [{"role": "user", "content": "hi"}],
                               "max_tokens": 120, **GREEDY}, path="/v1/chat/completions").json()
    assert chat["choices"][0]["finish_reason"] == "length"
    assert chat["usage"]["completion_tokens"] == 120


def test_a_short_generation_never_shifts(shifting):
    res = post(shifting.url, {"prompt": [5] * 10, "n_predict": 20, **GREEDY}).json()
    assert res["truncated"] is False and res["tokens_predicted"] == 20


@pytest.fixture(scope="module")
def geometry_server(tiny_model):
    from tests.conftest import ServerProcess

    srv = ServerProcess(tiny_model, "-c", "256", "-np", "-3", "-nocb", "-ub", "100",
                        "-b", "16", "--no-warmup").start()
    yield srv
    srv.stop()


def test_parallel_auto_batch_and_ubatch_geometry(geometry_server):
    import httpx

    props = httpx.get(geometry_server.url + "/props").json()
    # any negative --parallel is upstream's auto: 4 slots sharing one unified
    # KV budget, so each slot reports (and may use) the whole context
    assert props["total_slots"] == 4
    assert props["default_generation_settings"]["n_ctx"] == 256
    assert props["geometry"] == {"n_ctx": 256, "n_ctx_slot": 256, "n_slots": 4, "n_batch": 16,
                                 "n_ubatch": 100, "cont_batching": False,
                                 "context_shift": False, "kv_unified": True}
    assert [s["n_ctx"] for s in httpx.get(geometry_server.url + "/slots").json()] == [256] * 4
    geometry_server.wait_for_text(
        "n_ctx_slot = 256, n_batch = 16 (prefill chunk), n_ubatch = 100 (no MLX "
        "effect), cont_batching = false, context_shift = false", timeout=30)
    geometry_server.wait_for_text(
        "initializing, n_slots = 4, n_ctx_slot = 256, kv_unified = 'true'", timeout=30)
    # -b is the prefill chunk: a 50-token prompt is prefilled 16 tokens at a time
    frames, _ = stream_frames(geometry_server.url, {"prompt": [5] * 50, "n_predict": 2,
                                                    "return_progress": True, **GREEDY})
    processed = [f["prompt_progress"]["processed"] for f in frames if "prompt_progress" in f]
    assert processed[:4] == [0, 16, 32, 48], processed
    # -nocb still serves concurrent requests (their ordering is pinned in
    # tests/unit/engine/test_context_shift.py, where it is deterministic)
    import concurrent.futures as cf
    with cf.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda i: post(geometry_server.url, {
            "prompt": [5 + i] * 8, "n_predict": 6, **GREEDY}).json(), range(3)))
    assert [r["tokens_predicted"] for r in results] == [6, 6, 6]


def test_auto_slots_share_one_kv_budget(geometry_server):
    """Unified KV under auto slots (engine/kv_budget.py): one request holds
    more than an even share (64) of the 256-token context; two prompts of
    one request, 150 + 100 tokens each, cannot both be held (500 > 256):
    the second waits for the first's room instead of both failing, and four
    that outgrow the budget together all fail as upstream's do."""
    lone = post(geometry_server.url, {"prompt": [5] * 150, "n_predict": 100, **GREEDY})
    assert lone.status_code == 200, lone.text
    assert lone.json()["tokens_predicted"] == 100
    # both jobs are submitted at once; held together they would overflow at
    # the first step and fail with the error below, so both completing in
    # full means the second was admitted only once the first had ended
    pair = post(geometry_server.url, {"prompt": [[5] * 150, [6] * 150], "n_predict": 100,
                                      **GREEDY})
    assert pair.status_code == 200, pair.text
    assert [r["tokens_predicted"] for r in pair.json()] == [100, 100]
    four = post(geometry_server.url, {"prompt": [[5 + i] * 3 for i in range(4)],
                                      "n_predict": 70, **GREEDY})
    assert four.status_code == 500, four.text
    assert four.json()["error"] == {"code": 500, "type": "server_error",
                                    "message": "Context size has been exceeded."}


# -- the training-context cap ----------------------------------------------------

N_CTX_TRAIN = 96   # the variant's max_position_embeddings
CAP_LINE = ("the slot context (256) exceeds the training context of the model (96) "
            "- capping")


@pytest.fixture(scope="module")
def capped(tiny_model, tmp_path_factory):
    """The tiny weights under a config that claims a 96-token training
    context, served with -c 512 -np 2: 256-token slots before the cap."""
    import json

    from tests.conftest import ServerProcess

    ckpt = tmp_path_factory.mktemp("short-train")
    for f in tiny_model.iterdir():
        if f.name != "config.json":
            (ckpt / f.name).symlink_to(f)
    cfg = json.loads((tiny_model / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": N_CTX_TRAIN}))
    srv = ServerProcess(ckpt, "-c", "512", "-np", "2", "--no-warmup").start()
    yield srv
    srv.stop()


def test_a_slot_is_capped_at_the_training_context(capped):
    import httpx

    logged = [ln for ln in capped.stdout + capped.stderr if CAP_LINE in ln]
    assert len(logged) == 1 and " W mlxcel.engine: " in logged[0], \
        "".join(capped.stdout + capped.stderr)
    props = httpx.get(capped.url + "/props").json()
    assert props["default_generation_settings"]["n_ctx"] == N_CTX_TRAIN
    assert props["geometry"]["n_ctx"] == 512 and props["geometry"]["n_ctx_slot"] == N_CTX_TRAIN
    slots = httpx.get(capped.url + "/slots").json()
    assert [s["n_ctx"] for s in slots] == [N_CTX_TRAIN, N_CTX_TRAIN]
    meta = httpx.get(capped.url + "/v1/models").json()["data"][0]["meta"]
    assert meta["n_ctx_train"] == N_CTX_TRAIN
    # admission: a prompt that fits the 256-token share but not the cap
    r = post(capped.url, {"prompt": [5] * 100, "n_predict": 4})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == {
        "code": 400, "type": "exceed_context_size_error",
        "message": f"request (100 tokens) exceeds the available context size "
                   f"({N_CTX_TRAIN} tokens), try increasing it",
        "n_prompt_tokens": 100, "n_ctx": N_CTX_TRAIN}
    assert post(capped.url, {"prompt": [5] * (N_CTX_TRAIN - 1), "n_predict": 1}).status_code == 200
    # the bound: generation stops at the capped context, not at 256
    res = post(capped.url, {"prompt": [5] * 60, "n_predict": -1, **GREEDY}).json()
    assert res["tokens_predicted"] == N_CTX_TRAIN - 60
    assert res["stop_type"] == "limit" and res["truncated"] is True


def test_an_uncapped_server_says_nothing_about_the_training_context(bounded):
    logged = "".join(bounded.stdout + bounded.stderr)
    assert "exceeds the training context" not in logged

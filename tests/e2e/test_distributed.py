"""One model across two processes: `mlx.launch --backend ring -n 2` over
loopback starts the real server twice; rank 0 serves HTTP, rank 1 runs the
engine alone, and the model is split between them (tensor parallel: the
tiny fixture is qwen3, which mlx-lm can shard).

What is checked against one ordinary process on the same checkpoint:
greedy and seeded outputs are the same tokens (the all-reduce and rank 0's
sampled tokens), streaming works, a cancelled stream frees its slot on both
ranks (a follower that missed it would step another batch and the next
request would fail), a grammar (rank 0's alone) and a time limit (rank
0's clock) beside a plain job, and SIGTERM on rank 0 stops every rank.

One launch serves the whole module; the SIGTERM test ends it and runs last.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerProcess, free_port, wait_until

from .sse import iter_sse_lines, post, stream_frames

pytestmark = pytest.mark.e2e

LAUNCHER = Path(sys.executable).parent / "mlx.launch"
ARGS = ("-np", "2", "-c", "1024", "--no-warmup")
PROMPTS = ("The capital of France is", "hello world", "1, 2, 3,")
STOP_BOUND_S = 15.0


def _ring_ports() -> int:
    """A port p with p and p + 1 free: the ring backend listens on one per rank."""
    for _ in range(50):
        p = free_port()
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
    raise AssertionError("no two consecutive free ports on 127.0.0.1")


class LaunchedServer(ServerProcess):
    """The server under `mlx.launch`: two ranks on 127.0.0.1."""

    def __init__(self, model: Path, *args: str) -> None:
        super().__init__(model, *args)
        self.argv = [str(LAUNCHER), "--backend", "ring", "-n", "2",
                     "--starting-port", str(_ring_ports()), "--", *self.argv]

    def ranks(self) -> dict[int, int]:
        """{rank: pid} of the processes the launcher started."""
        found = {}
        children = []  # the launcher starts each rank from a thread of its own
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                children += [int(p) for p in (task / "children").read_text().split()]
            except OSError:
                continue
        for pid in children:
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            for var in env:
                if var.startswith(b"MLX_RANK="):
                    found[int(var[9:])] = pid
        return found


@pytest.fixture(scope="module")
def launched(tiny_model):
    if not LAUNCHER.exists():
        pytest.skip(f"mlx.launch is not installed beside {sys.executable}")
    import mlx.core as mx

    if not mx.distributed.is_available():
        pytest.skip("this MLX build has no distributed backend")
    srv = LaunchedServer(tiny_model, *ARGS)
    try:
        yield srv.start()
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def single(server):
    """One ordinary process on the same checkpoint: the session's shared
    server (a lone request decodes the same tokens whatever the slot count)."""
    return server


def complete(url: str, prompt: str, **extra) -> dict:
    r = post(url, {"prompt": prompt, "n_predict": 8, "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_the_launch_split_the_model(launched) -> None:
    assert set(launched.ranks()) == {0, 1}
    out = "".join(launched.stdout) + "".join(launched.stderr)
    assert "rank 1 of 2: joining the other processes (tensor split)" in out
    # one HTTP server: rank 0's
    assert sum(ln.startswith("main: server is listening") for ln in launched.stdout) == 1


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_an_idle_follower_waits_on_its_doorbell(launched) -> None:
    """While rank 0 has nothing to step, rank 1 blocks on a socket instead
    of polling inside the ring collective (which costs a whole core)."""
    out = "".join(launched.stdout) + "".join(launched.stderr)
    assert "rank 1 of 2: followers wait on a doorbell while rank 0 is idle" in out
    complete(launched.url, "Warm")   # then nothing in flight
    follower = launched.ranks()[1]
    before, t0 = _cpu_seconds(follower), time.monotonic()
    while time.monotonic() - t0 < 2.0:   # a measured idle window, not a synchronization
        time.sleep(0.2)
    used = _cpu_seconds(follower) - before
    assert used < 0.5, f"the idle follower used {used:.2f} CPU-seconds in 2 s"
    # and it still steps when asked
    assert complete(launched.url, "Again")["content"] is not None


@pytest.mark.parametrize("sampling", [{"temperature": 0},
                                      {"temperature": 1.0, "seed": 7, "top_k": 40}],
                         ids=["greedy", "seeded"])
def test_outputs_match_one_process(launched, single, sampling) -> None:
    for prompt in PROMPTS:
        got = complete(launched.url, prompt, **sampling)
        want = complete(single.url, prompt, **sampling)
        assert got["content"] == want["content"], prompt
        assert got["tokens_predicted"] == want["tokens_predicted"] == 8


def test_streaming_matches_the_whole_answer(launched) -> None:
    frames, _ = stream_frames(launched.url, {"prompt": PROMPTS[0], "n_predict": 8,
                                             "temperature": 0})
    text = "".join(f["content"] for f in frames if isinstance(f, dict))
    assert frames[-1]["stop"] is True
    assert text == complete(launched.url, PROMPTS[0])["content"]


def test_a_cancelled_stream_frees_its_slot_on_every_rank(launched) -> None:
    body = {"prompt": PROMPTS[1], "n_predict": -1, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.Client(timeout=30) as c:
        with c.stream("POST", launched.url + "/completion", json=body) as r:
            seen = 0
            for line in iter_sse_lines(r):
                seen += line.startswith("data: ")
                if seen >= 3:
                    break  # leaving the block closes the connection mid-stream
    wait_until(lambda: httpx.get(launched.url + "/slots", timeout=10).json(),
               "both slots idle after the client went away", 10.0,
               until=lambda s: not any(x["is_processing"] for x in s))
    # both ranks dropped the job: the next request runs the same batch on each
    assert complete(launched.url, PROMPTS[2])["tokens_predicted"] == 8


def test_grammar_and_time_limit_beside_a_plain_job(launched) -> None:
    """Only rank 0 holds a grammar, and a time limit reads rank 0's clock:
    both jobs run in one batch on both ranks and end where rank 0 says."""
    import threading

    grammar = 'root ::= ([a-z] [a-z]? "\\n")+'
    bodies = [{"prompt": "list:", "n_predict": 16, "temperature": 0, "grammar": grammar,
               "t_max_predict_ms": 1},
              {"prompt": "list:", "n_predict": 16, "temperature": 0, "grammar": grammar}]
    got: dict[int, dict] = {}

    def run(i: int) -> None:
        got[i] = post(launched.url, bodies[i]).json()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    limited, plain = got[0], got[1]
    assert limited["stop_type"] == "limit" and limited["content"].count("\n") == 1, limited
    assert plain["tokens_predicted"] == 16
    assert set(plain["content"]) <= set("abcdefghijklmnopqrstuvwxyz\n")
    assert complete(launched.url, PROMPTS[0])["tokens_predicted"] == 8


def test_sigterm_on_rank_0_stops_every_rank(launched) -> None:
    ranks = launched.ranks()
    os.kill(ranks[0], signal.SIGTERM)
    t0 = time.monotonic()
    try:
        code = launched.wait(STOP_BOUND_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"mlx.launch still running {STOP_BOUND_S} s after SIGTERM on "
                             f"rank 0:\n{launched.drain(1)}") from None
    assert code == 0, launched.drain()
    for rank, pid in ranks.items():
        assert not Path(f"/proc/{pid}").exists() or \
            Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", f"rank {rank} still running"
    out = launched.drain()
    assert "rank 1: stopped" in out
    assert time.monotonic() - t0 < STOP_BOUND_S

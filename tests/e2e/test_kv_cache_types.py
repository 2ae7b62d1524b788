"""-ctk / -ctv on a real server: upstream's tuning command line with a
quantized KV cache starts and serves concurrent streams, prefix reuse and
slot files; a checkpoint whose heads cannot be quantized is refused before
the server listens."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from .sse import post, stream_frames

pytestmark = pytest.mark.e2e

GREEDY = {"temperature": 0.0, "seed": 1}
# upstream's tuning flags, copied from a real deployment, plus a quantized cache
UPSTREAM_LINE = ("-t", "8", "--mlock", "--no-mmap", "-ngl", "99", "-fa", "on",
                 "--numa", "distribute", "-ctk", "q8_0", "-ctv", "q8_0", "--jinja")


@pytest.fixture(scope="module")
def q8_server(tiny_wide_model, start_server, tmp_path_factory):
    slots = tmp_path_factory.mktemp("kv-slots")
    srv = start_server(tiny_wide_model, *UPSTREAM_LINE, "-c", "2048", "-np", "2",
                       "--slot-save-path", str(slots))
    yield srv
    srv.stop()


def _text(frames) -> str:
    return "".join(f["content"] for f in frames if isinstance(f, dict))


def test_quantized_cache_serves_concurrent_streams_and_reuses_prefixes(q8_server):
    q8_server.wait_for_text("KV cache: K as q8_0 (8-bit groups of 32), V as q8_0")
    assert "KV cache K q8_0, V q8_0" in q8_server.wait_for_text("main: choices: ")
    prompts = ["the quantized cache keeps every slot " * 6, "a second stream beside it"]
    results: dict[int, str] = {}

    def stream(i: int) -> None:
        frames, _ = stream_frames(q8_server.url, {"prompt": prompts[i], "n_predict": 24,
                                                  "ignore_eos": True, **GREEDY})
        results[i] = _text(frames)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == [0, 1] and all(results.values()), results

    # the same prompt again: its prefix comes from the (quantized) prompt cache
    again = post(q8_server.url, {"prompt": prompts[0], "n_predict": 24, "ignore_eos": True,
                                 **GREEDY}).json()
    assert again["timings"]["cache_n"] > 0, again["timings"]
    assert again["content"] == results[0]


def test_slot_files_round_trip_with_a_quantized_cache(q8_server):
    j = post(q8_server.url, {"prompt": "slot files hold tokens", "n_predict": 6, "id_slot": 0,
                             **GREEDY}).json()
    n = j["tokens_evaluated"] + j["tokens_predicted"]
    saved = post(q8_server.url, {"filename": "q8.slot"}, path="/slots/0?action=save").json()
    assert saved["n_saved"] == n
    restored = post(q8_server.url, {"filename": "q8.slot"}, path="/slots/1?action=restore").json()
    assert restored["n_restored"] == n
    chat = post(q8_server.url, {"messages": [{"role": "user", "content": "hi"}],
                                "max_tokens": 4}, path="/v1/chat/completions")
    assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] == 4


def test_narrow_heads_refuse_a_quantized_cache_before_listening(tiny_model):
    proc = subprocess.run(
        [sys.executable, "-m", "mlxcel_trio", "-m", str(tiny_model), "-ctk", "q4_0",
         "-ctv", "q4_0", "--port", "0"], check=False, capture_output=True, text=True,
        timeout=60,
        stdin=subprocess.DEVNULL)
    assert proc.returncode == 1, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "heads are 16 wide" in errors[0], proc.stderr
    assert "-ctk f16 -ctv f16" in errors[0]
    assert "listening" not in proc.stdout and "Traceback" not in proc.stderr

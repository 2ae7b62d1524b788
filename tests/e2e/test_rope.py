"""RoPE overrides through a real server: the checkpoint's own base reproduces
the default server's probabilities exactly at a long position, another base
moves them, and an override the checkpoint cannot compose stops startup."""

from __future__ import annotations

import json


from tests.e2e.sse import post

PROMPT = [(i * 37) % 1500 + 5 for i in range(1500)]   # long positions
BODY = {"prompt": PROMPT, "n_predict": 1, "n_probs": 5, "temperature": 0}


def _probs(start_server, tiny_model, *flags):
    srv = start_server(tiny_model, "-c", "2048", "-np", "1", "--no-warmup", *flags)
    try:
        r = post(srv.url, BODY)
        assert r.status_code == 200, r.text
        return r.json()["completion_probabilities"]
    finally:
        srv.stop()


def test_rope_freq_base_acts_and_its_own_value_is_identical(start_server, tiny_model):
    theta = json.loads((tiny_model / "config.json").read_text())["rope_theta"]
    ref = _probs(start_server, tiny_model)
    assert _probs(start_server, tiny_model, "--rope-freq-base", repr(theta)) == ref
    assert _probs(start_server, tiny_model, "--rope-freq-base", "10000") != ref
    assert _probs(start_server, tiny_model, "--rope-scaling", "yarn", "--rope-scale", "4") != ref


def test_a_bare_scale_on_a_banded_checkpoint_stops_startup(tiny_model, tmp_path):
    from tests.conftest import ServerProcess

    for f in tiny_model.iterdir():
        (tmp_path / f.name).symlink_to(f)
    cfg = json.loads((tiny_model / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    srv = ServerProcess(tmp_path, "--rope-scale", "2", "--no-warmup").start(wait_ready=False)
    try:
        assert srv.wait(60) != 0
    finally:
        srv.stop()
    err = "".join(srv.stderr + srv.stdout)
    assert "'llama3'" in err and "--rope-scaling linear" in err, err
    assert "main: model loaded" not in err

"""engine/distributed.py without a second process: where a process stands in
mlx.launch's world, how a checkpoint is split (and every refusal, each
naming the option, the value and what to do instead), and the per-step
record's framing.  tests/e2e/test_distributed.py runs two real ranks.

White-box: reads the module's private `_portable` (what crosses ranks)."""

from __future__ import annotations

import re

import json
from pathlib import Path

import attrs
import pytest

from mlxcel_trio.config import ServerConfig
from mlxcel_trio.engine import distributed as dist
from mlxcel_trio.engine.distributed import PIPELINE, TENSOR, World
from mlxcel_trio.protocol.records import Job, Started, Submit, TokenPiece


def test_one_process_alone_is_a_world_of_one() -> None:
    assert World.from_env({}) == World(0, 1)
    assert not World.from_env({}).distributed


def test_the_ring_world_comes_from_mlx_launch_hostfile(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([["127.0.0.1:5000"], ["127.0.0.1:5001"], ["10.0.0.2:5000"]]))
    w = World.from_env({"MLX_HOSTFILE": str(hostfile), "MLX_RANK": "2"})
    assert (w.rank, w.size, w.leader, w.distributed) == (2, 3, False, True)
    # mlx.launch -n 1 writes an empty hostfile
    hostfile.write_text("\n")
    assert World.from_env({"MLX_HOSTFILE": str(hostfile), "MLX_RANK": "0"}).size == 1


def test_mpi_and_nccl_worlds() -> None:
    assert World.from_env({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3"}) == World(3, 4)
    assert World.from_env({"MLX_WORLD_SIZE": "2", "MLX_RANK": "0"}) == World(0, 2)


def _as(tiny: Path, tmp_path: Path, **changes) -> str:
    """The tiny checkpoint's config as another architecture or shape (the
    split is planned from config.json alone)."""
    out = tmp_path / "ckpt"
    out.mkdir()
    config = json.loads((tiny / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, **changes}))
    return str(out)


TWO = World(0, 2)


def test_unset_takes_tensor_parallel_where_the_architecture_shards(tiny_model) -> None:
    assert dist.plan_split(None, str(tiny_model), TWO) == TENSOR      # qwen3: shard only
    assert dist.plan_split("row", str(tiny_model), TWO) == TENSOR
    assert dist.plan_split("tensor", str(tiny_model), TWO) == TENSOR


def test_layer_is_the_pipeline_where_mlx_lm_has_one(tiny_model, tmp_path) -> None:
    qwen2 = _as(tiny_model, tmp_path, model_type="qwen2")          # shard and pipeline
    assert dist.plan_split("layer", qwen2, TWO) == PIPELINE
    assert dist.plan_split(None, qwen2, TWO) == TENSOR


def test_layer_without_a_pipeline_names_row(tiny_model) -> None:
    with pytest.raises(ValueError) as err:
        dist.plan_split("layer", str(tiny_model), TWO)
    assert str(err.value).startswith("--split-mode 'layer': mlx-lm has no pipeline split for "
                                     "the qwen3 architecture; use --split-mode row")


def test_row_without_shard_names_layer_or_one_process(tiny_model, tmp_path) -> None:
    gemma = _as(tiny_model, tmp_path, model_type="gemma")           # neither
    with pytest.raises(ValueError, match=r"--split-mode 'row': .* gemma .*serve it from one "):
        dist.plan_split("row", gemma, TWO)
    with pytest.raises(ValueError, match="cannot be split across processes"):
        dist.plan_split(None, gemma, TWO)


def test_none_and_indivisible_heads_are_refused(tiny_model) -> None:
    with pytest.raises(ValueError, match=r"--split-mode 'none' .* started 2; use --split-mode "
                                         r"row .* or layer"):
        dist.plan_split("none", str(tiny_model), TWO)
    with pytest.raises(ValueError, match=r"num_attention_heads = 4 does not divide among 3 "):
        dist.plan_split("row", str(tiny_model), World(0, 3))


@pytest.mark.parametrize(("changes", "needle"), [
    ({"spec_model": "/d"}, "-md '/d' cannot be served across 2 processes"),
    ({"adapters": (("/a", 1.0),)}, "--lora cannot be served"),
    ({"embedding_model": "/e"}, "--embedding-model cannot be served"),
    ({"sleep_idle_seconds": 30}, "--sleep-idle-seconds 30 cannot be served"),
    ({"router": True}, "router mode"),
])
def test_features_one_process_alone_can_serve_are_refused(tiny_model, changes, needle) -> None:
    cfg = attrs.evolve(ServerConfig(model=str(tiny_model)), **changes)
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")) as err:
        dist.plan(cfg, TWO)
    assert "; " in str(err.value)  # and what to do instead


def test_media_checkpoints_are_refused(tiny_vlm_model, tiny_whisper_model) -> None:
    from fixtures.build import ensure

    for path, what in ((tiny_vlm_model, "a vision-language checkpoint"),
                       (tiny_whisper_model, "a Whisper (speech-to-text) checkpoint"),
                       (ensure("tiny-gemma3n"), "a chat checkpoint with an audio tower")):
        with pytest.raises(ValueError, match=rf"-m names {re.escape(what)}, which cannot be "
                                             r"served across 2 processes .*; serve it from one"):
            dist.plan(ServerConfig(model=str(path)), TWO)


def test_the_record_frames_small_and_large_payloads() -> None:
    import mlx.core as mx

    lockstep = dist.Lockstep(mx.distributed.init())  # a world of one: the sum is the payload
    for n in (0, 10, dist.HEAD_BYTES - 8, dist.HEAD_BYTES, 3 * dist.HEAD_BYTES + 5):
        payload = bytes(range(256)) * (n // 256) + bytes(n % 256)
        assert lockstep._broadcast(payload) == payload


def test_a_submit_travels_without_its_grammar_and_settings() -> None:
    job = Job(3, (1, 2), n_predict=4, grammar=object(), settings=object())
    sent = dist._portable(Submit(job))
    assert sent.job.grammar is None and sent.job.settings is None
    assert attrs.evolve(sent.job, grammar=job.grammar, settings=job.settings) == job


def test_the_digest_covers_admissions_and_tokens_only() -> None:
    started = Started(1, 0, 4, 0)
    a = dist.digest([started, TokenPiece(1, 7, "x", 1, True, False, None, None)])
    b = dist.digest([started, TokenPiece(1, 8, "x", 1, True, False, None, None)])
    assert a != b
    assert dist.digest([]) == dist.digest(["anything else"])

"""Context, batching, RoPE and control-vector options: what a command line
resolves to, and what is refused before any model is loaded."""

from __future__ import annotations

import pytest

from mlxcel_trio.cli.main import prepare
from mlxcel_trio.cli.parser import CliError
from mlxcel_trio.config import RopeOverrides


def config(tiny_model, *argv, env=None):
    return prepare([*argv, "-m", str(tiny_model)], env=env or {})


def refused(tiny_model, *argv) -> str:
    with pytest.raises(CliError) as err:
        config(tiny_model, *argv)
    return str(err.value)


def test_context_and_batching_resolve(tiny_model):
    c = config(tiny_model, "--context-shift", "--keep", "-1", "-nocb", "-ub", "64", "-b", "32")
    assert (c.context_shift, c.n_keep, c.cont_batching, c.ubatch_size, c.batch_size) == \
        (True, -1, False, 64, 32)
    d = config(tiny_model)
    assert (d.context_shift, d.n_keep, d.cont_batching) == (False, 0, True)
    env = config(tiny_model, env={"LLAMA_ARG_CONTEXT_SHIFT": "1",
                                  "LLAMA_ARG_NO_CONT_BATCHING": "1"})
    assert env.context_shift is True and env.cont_batching is False


@pytest.mark.parametrize("value, slots", [("-1", 4), ("-7", 4), ("1", 1), ("3", 3)])
def test_parallel_takes_upstreams_whole_domain(tiny_model, value, slots):
    assert config(tiny_model, "-np", value).slots == slots


def test_rope_overrides_resolve(tiny_model):
    c = config(tiny_model, "--rope-scaling", "yarn", "--rope-scale", "4",
               "--rope-freq-scale", "0.25", "--rope-freq-base", "5e5", "--yarn-orig-ctx", "2048",
               "--yarn-beta-fast", "16", "--yarn-attn-factor", "0.7")
    assert c.rope == RopeOverrides(scaling="yarn", scale=4.0, freq_scale=0.25,
                                   freq_base=5e5, yarn_orig_ctx=2048, yarn_beta_fast=16.0,
                                   yarn_attn_factor=0.7)
    assert not config(tiny_model).rope.any


@pytest.mark.parametrize("argv, needle", [
    (["-np", "0"], "--parallel '0': invalid value for n_parallel"),
    (["--rope-scale", "0"], "invalid value '0' for --rope-scale: out of range; expected a number above 0"),
    (["--rope-freq-base", "-1"], "invalid value '-1' for --rope-freq-base"),
    (["--rope-freq-scale", "-2"], "invalid value '-2' for --rope-freq-scale"),
    (["--rope-scale", "4", "--rope-freq-scale", "0.5"],
     "--rope-freq-scale '0.5': not the reciprocal of --rope-scale 4"),
    (["--control-vector", "v.gguf"], "logit-bias"),
    (["--control-vector-scaled", "v.gguf:0"], "logit_bias"),
])
def test_rope_values_refused_before_load(tiny_model, argv, needle):
    assert needle in refused(tiny_model, *argv)


@pytest.mark.parametrize("argv", [
    ["--yarn-ext-factor", "1.0"], ["--yarn-ext-factor", "-5"], ["--yarn-ext-factor", "0"],
    ["--yarn-ext-factor", "0.5"], ["--yarn-attn-factor", "3"],
    ["--rope-scale", "4", "--rope-freq-scale", "0.25"], ["--rope-freq-base", "0"],
    ["--control-vector-layer-range", "1", "10"],
])
def test_accepted_forms(tiny_model, argv):
    config(tiny_model, *argv)

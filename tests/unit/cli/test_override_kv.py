"""--override-kv parsing (cli/override_kv.py) and its mapping onto the config."""

from __future__ import annotations

import pytest

from mlxcel_trio.cli.main import build_config
from mlxcel_trio.cli.override_kv import KvOverrideList
from mlxcel_trio.cli.parser import parse
from mlxcel_trio.cli.values import BadValue


def _config(*argv: str):
    parsed = parse(["-m", "/m", *argv], env={})
    assert not parsed.problems, parsed.problems
    return build_config(parsed, "/m")


def test_upstreams_example_and_the_arch_keys_map():
    cfg = _config("--override-kv", "tokenizer.ggml.add_bos_token=bool:false,"
                  "tokenizer.ggml.add_eos_token=bool:true",
                  "--override-kv", "llama.context_length=int:4096,llama.rope.freq_base=float:5e5,"
                  "llama.rope.scaling.type=str:yarn,llama.rope.scaling.factor=float:4,"
                  "llama.rope.scaling.original_context_length=int:1024")
    assert (cfg.add_bos, cfg.add_eos, cfg.n_ctx_train) == (False, True, 4096)
    assert (cfg.rope.freq_base, cfg.rope.scaling, cfg.rope.scale, cfg.rope.yarn_orig_ctx) == \
        (5e5, "yarn", 4.0, 1024)


def test_a_later_item_wins_and_a_rope_option_beats_the_metadata():
    cfg = _config("--override-kv", "x.context_length=int:1,x.context_length=int:2",
                  "--override-kv", "x.rope.freq_base=float:7", "--rope-freq-base", "9")
    assert cfg.n_ctx_train == 2 and cfg.rope.freq_base == 9.0


def test_nothing_given_changes_nothing():
    cfg = _config()
    assert (cfg.add_bos, cfg.add_eos, cfg.n_ctx_train) == (None, None, 0)


@pytest.mark.parametrize(("item", "says"), [
    ("general.name=str:x", "'general.name' has no analogue"),
    ("llama.vocab_size=int:3", "'llama.vocab_size' has no analogue"),
    ("tokenizer.ggml.add_bos_token=bool:yes", "invalid boolean value for KV override"),
    ("tokenizer.ggml.add_bos_token=int:1", "is read as bool, not int"),
    ("llama.context_length=int:0", "must be above 0"),
    ("llama.rope.scaling.type=str:ntk", "one of none, linear, yarn"),
    ("llama.rope.freq_base=float:abc", "is not a number"),
    ("nokey", "malformed KV override 'nokey'"),
    ("a.context_length=double:1", "invalid type for KV override"),
])
def test_refusals_name_the_item(item, says):
    with pytest.raises(BadValue, match=None) as exc:
        KvOverrideList().parse(item)
    assert says in str(exc.value), exc.value

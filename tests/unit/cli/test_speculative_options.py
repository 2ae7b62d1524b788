"""The speculative options: upstream's domains and words, the pairings
between --spec-type and -md, and the draft's vocabulary check, all before
any model loads (no MLX here: checkpoints are config and tokenizer files)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mlxcel_trio.cli.main import prepare
from mlxcel_trio.cli.parser import CliError


def _tokenizer(path: Path, words: list[str]) -> None:
    vocab = {w: i for i, w in enumerate(words)}
    (path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab},
                                                     "added_tokens": []}))


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    words = [f"w{i}" for i in range(64)]
    out = []
    for name in ("target", "draft"):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": 64,
                                                   "eos_token_id": 3}))
        _tokenizer(d, words)
        (d / "model.safetensors").write_bytes(b"")   # resolution looks for weights only
        out.append(d)
    return out[0], out[1]


def lines(argv: list[str]) -> list[str]:
    try:
        prepare(argv, env={})
    except CliError as exc:
        return list(exc.lines)
    return []


@pytest.mark.parametrize(("argv", "words"), [
    (["--spec-type", "bogus"], "unknown speculative type: bogus"),
    (["--spec-ngram-simple-size-n", "0"], "ngram size N must be between 1 and 1024 inclusive"),
    (["--spec-ngram-map-k-size-m", "2000"], "ngram size M must be between 1 and 1024 inclusive"),
    (["--spec-ngram-map-k4v-min-hits", "0"], "ngram min hits must be at least 1"),
    (["--spec-ngram-mod-n-max", "-1"], "ngram n-max must be between 0 and 1024 inclusive"),
    (["--spec-draft-n-max", "-1"], "invalid value"),
    (["--spec-type", "draft-simple"], "draft-simple needs a draft model; add -md"),
    (["--spec-type", "draft-dspark"], "MLX checkpoints do not carry"),
    (["--draft-max", "4"], ("the argument has been removed; use --spec-draft-n-max or "
                            "--spec-ngram-mod-n-max")),
])
def test_bad_values_are_refused_with_upstreams_words(pair, argv, words):
    target, _ = pair
    got = lines(["-m", str(target), *argv])
    assert len(got) == 1 and words in got[0], got


def test_every_problem_is_reported_in_one_run(pair):
    target, _ = pair
    got = lines(["-m", str(target), "--spec-type", "draft-mtp", "--spec-ngram-mod-n-match", "0",
                 "--draft", "3"])
    assert len(got) == 3, got


def test_a_draft_alone_selects_draft_simple(pair):
    target, draft = pair
    config = prepare(["-m", str(target), "-md", str(draft)], env={})
    assert config.speculative.types == ("draft-simple",)
    assert config.speculative.names == "draft-simple"
    config = prepare(["-m", str(target), "-md", str(draft), "--spec-type",
                      "draft-simple,ngram-simple"], env={})
    assert config.speculative.types == ("ngram-simple", "draft-simple")  # upstream's order
    assert lines(["-m", str(target), "-md", str(draft), "--spec-type", "ngram-simple"])


def test_a_draft_with_another_vocabulary_is_refused(pair, tmp_path):
    target, draft = pair
    _tokenizer(draft, [f"w{i}" for i in range(7)] + ["other"] + [f"w{i}" for i in range(8, 64)])
    (line,) = lines(["-m", str(target), "-md", str(draft)])
    assert "draft model vocab must match target model to use speculation" in line
    assert "token 7 is 'w7' in the target and 'other' in the draft" in line
    bigger = tmp_path / "bigger"
    shutil.copytree(target, bigger)
    (bigger / "config.json").write_text(json.dumps({"vocab_size": 512, "eos_token_id": 3}))
    (line,) = lines(["-m", str(target), "-md", str(bigger)])
    assert "64 tokens and the draft 512" in line

"""The sampling flags: startup classification (in-process), and one real
server whose defaults come from them (/props, generation_settings, and
behaviour a request inherits)."""

from __future__ import annotations

import math

import httpx
import pytest

from mlxcel_trio.cli.main import prepare
from mlxcel_trio.cli.parser import CliError

from .sse import post

pytestmark = pytest.mark.e2e

DEFAULT_ORDER = "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature"


def outcome(argv, model):
    try:
        return prepare([*argv, "-m", str(model)], env={})
    except CliError as exc:
        assert "\n" not in str(exc)
        return str(exc)


@pytest.mark.parametrize(("argv", "needle"), [
    (["--samplers", "top_k;temperature"], "--samplers 'top_k;temperature': sampler order"),
    (["--sampler-seq", "kt"], "--sampler-seq 'kt': sampler order top_k;temperature"),
    (["--sampler-seq", ""], "--sampler-seq"),
    (["--repeat-penalty", "0"], "must be finite and greater than 0"),
    (["--repeat-penalty", "1e-45"], "must be finite and greater than 0"),
    (["--repeat-last-n", "-1"], "--repeat-last-n"),
    (["--dry-penalty-last-n", "-1"], "--dry-penalty-last-n"),
    (["-l", "15043"], "invalid input format"),
    (["--logit-bias", "x+1"], "invalid input format"),
    (["--mirostat", "3"], "--mirostat"),
])
def test_refused_at_startup(tiny_model, argv, needle):
    line = outcome(argv, tiny_model)
    assert isinstance(line, str) and needle in line


def test_accepted_values_reach_the_config(tiny_model):
    cfg = outcome(["--samplers", DEFAULT_ORDER + ";adaptive_p", "--sampler-seq", "edskypmxt",
                   "-l", "15043+1", "--logit-bias", "7-inf", "-l", "9 + 0.5",
                   "--dry-sequence-breaker", "a", "--dry-sequence-breaker", "none",
                   "--dry-sequence-breaker", "b", "-r", "x", "-r", "y", "--dry-base", "0.5",
                   "--no-escape", "--ignore-eos"], tiny_model).sampling
    assert cfg.logit_bias == ((15043, 1.0), (7, -math.inf), (9, 0.5))
    assert cfg.dry_sequence_breakers == ("a", "none", "b")
    assert cfg.reverse_prompt == ("x", "y") and cfg.escape is False and cfg.ignore_eos is True


FLAGS = ["--temp", "1.0", "--top-k", "12", "--top-nsigma", "2.5", "--xtc-probability", "0.25",
         "--xtc-threshold", "0.3", "--typical", "0.97", "--repeat-last-n", "32",
         "--repeat-penalty", "1.1", "--presence-penalty", "0.2", "--frequency-penalty", "0.3",
         "--dry-multiplier", "0.5", "--dry-base", "0.5", "--dry-allowed-length", "3",
         "--dry-penalty-last-n", "16", "--dry-sequence-breaker", "\\n",
         "--dry-sequence-breaker", "END", "--adaptive-target", "0.3", "--adaptive-decay", "0.8",
         "--dynatemp-range", "0.1", "--dynatemp-exp", "1.5", "--mirostat-lr", "0.2",
         "--mirostat-ent", "4", "--samplers", DEFAULT_ORDER + ";adaptive_p", "--ignore-eos",
         "-l", "300+40", "-r", "ot\\tq", "-r", " g g", "-s", "21"]


@pytest.fixture(scope="module")
def flagged(tiny_model, start_server):
    return start_server(tiny_model, "-np", "2", "-c", "1024", *FLAGS)


def test_flags_become_the_reported_defaults(flagged):
    params = httpx.get(flagged.url + "/props", timeout=30).json()[
        "default_generation_settings"]["params"]
    want = {"temperature": 1.0, "top_k": 12, "top_n_sigma": 2.5, "xtc_probability": 0.25,
            "xtc_threshold": 0.3, "typical_p": 0.97, "repeat_last_n": 32,
            "repeat_penalty": 1.1, "presence_penalty": 0.2, "frequency_penalty": 0.3,
            "dry_multiplier": 0.5, "dry_base": 1.75, "dry_allowed_length": 3,
            "dry_penalty_last_n": 16, "adaptive_target": 0.3, "adaptive_decay": 0.8,
            "dynatemp_range": 0.1, "dynatemp_exponent": 1.5, "mirostat_eta": 0.2,
            "mirostat_tau": 4.0, "ignore_eos": True, "seed": 21}
    for key, value in want.items():
        assert params[key] == pytest.approx(value, rel=1e-6), key
    assert params["samplers"] == DEFAULT_ORDER.split(";") + ["adaptive_p"]
    gs = post(flagged.url, {"prompt": "x", "n_predict": 1}).json()["generation_settings"]
    assert gs["dry_sequence_breakers"] == ["\n", "END"]  # escapes processed (-e is on)
    assert gs["stop"] == ["ot\tq", " g g"]
    assert gs["logit_bias"][0] == {"bias": 40.0, "token": 300}
    assert {"bias": None, "token": 1538} in gs["logit_bias"]


def test_requests_inherit_the_flags_and_can_override_them(flagged):
    # -l 300+40 forces " g" under greedy decoding; -r " g g" stops the text
    res = post(flagged.url, {"prompt": "x", "n_predict": 20, "temperature": 0,
                             "repeat_penalty": 1.0, "dry_multiplier": 0}).json()
    assert res["stop_type"] == "word" and res["stopping_word"] == " g g"
    assert res["content"] == "" and res["tokens_predicted"] == 2
    # a request's own logit_bias replaces the server's list (and its stop list the -r ones)
    res = post(flagged.url, {"prompt": "x", "n_predict": 6, "temperature": 0,
                             "logit_bias": [[301, 40]], "stop": ["zzz"],
                             "return_tokens": True}).json()
    assert set(res["tokens"]) == {301}
    assert res["generation_settings"]["logit_bias"] == [{"bias": 40.0, "token": 301}]

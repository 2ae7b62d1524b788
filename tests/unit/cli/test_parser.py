"""argparse built from the table: spellings, env binding, precedence, errors."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from mlxcel_trio.cli.main import build_config
from mlxcel_trio.cli.options import OPTIONS, Option
from mlxcel_trio.cli.parser import CliError, Parsed, build_parser, parse
from mlxcel_trio.cli.values import Int
from mlxcel_trio.config import ServerConfig

# One sample per value option: the raw text and the ServerConfig value it
# must produce.  test_every_value_option_has_a_sample keeps this complete.
_TEMPLATE_FILE = str(Path(__file__).resolve().parents[3] / "fixtures" / "chat_template.jinja")
SAMPLES: dict[str, tuple[str, Any]] = {
    # issue #4: chat templates and reasoning
    "chat_reasoning_format": ("deepseek-legacy", "deepseek-legacy"),
    "chat_reasoning_alias_field": ("none", "none"),
    "chat_reasoning": ("enabled", "on"),
    "chat_reasoning_effort": ("high", "high"),
    "chat_template": ("{{ messages }}", "{{ messages }}"),
    "chat_template_file": (_TEMPLATE_FILE, _TEMPLATE_FILE),
    "chat_template_kwargs": ('{"enable_thinking": false}', '{"enable_thinking": false}'),
    "chat_reasoning_budget": ("256", 256),
    "chat_reasoning_budget_message": ("Time to answer.", "Time to answer."),
    "model": ("some/model", "some/model"),
    # issue #6: idle sleep
    "sleep_idle_seconds": ("300", 300),
    "split_mode": ("row", "row"),
    # issue #8: context and RoPE
    "n_keep": ("-1", -1),
    "rope.scaling": ("yarn", "yarn"),
    "rope.scale": ("4", 4.0),
    "rope.freq_base": ("500000", 500000.0),
    "rope.freq_scale": ("0.25", 0.25),
    "rope.yarn_orig_ctx": ("8192", 8192),
    "rope.yarn_ext_factor": ("0.5", 0.5),
    "rope.yarn_attn_factor": ("0.5", 0.5),
    "rope.yarn_beta_slow": ("2", 2.0),
    "rope.yarn_beta_fast": ("16", 16.0),
    "ctx_size": ("4096", 4096),
    "pooling": ("cls", "cls"),
    "embedding_model": ("some/dir", "some/dir"),
    "reranker_model": ("other/dir", "other/dir"),
    "embd_normalize": ("1", 1),
    "sampling.n_predict": ("128", 128),
    "batch_size": ("512", 512),
    "sampling.seed": ("-2", 4294967294),
    "sampling.temperature": ("0.25", 0.25),
    "sampling.top_k": ("7", 7),
    "sampling.top_p": ("0.5", 0.5),
    "sampling.min_p": ("0.1", 0.1),
    "host": ("0.0.0.0", "0.0.0.0"),
    "port": ("9999", 9999),
    "n_parallel": ("3", 3),
    "aliases": ("zebra,apple", ("zebra", "apple")),
    "api_keys": ("k1,k2", ("k1", "k2")),
    "timeout": ("60", 60),
    "sse_ping_interval": ("-1", -1),
    "hf_token": ("hf_abc", "hf_abc"),
    "hf_repo": ("some/model", "some/model"),
    "tags": ("a,b", ("a", "b")),
    # issue #8: the prompt cache and slot files
    "cache_ram": ("-1", -1),
    "cache_reuse": ("256", 256),
    "cache_disk": ("/tmp/mlxcel-cache", "/tmp/mlxcel-cache"),
    "cache_disk_mib": ("512", 512),
    "cache_type_k": ("q8_0", "q8_0"),
    "cache_type_v": ("bf16", "bf16"),
    "blas": ("bundled", "bundled"),
    "lora": ("a,b", ((("a", 1.0), ("b", 1.0)),)),
    "models_dir": (str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent)),
    "models_max": ("2", 2),
    "model_store_root": ("/srv/models", "/srv/models"),
    "models_preset": ("models.ini", "models.ini"),
    "lora_scaled": ("a:0.5", ((("a", 0.5),),)),
    "override_kv": ("llama.context_length=int:64,tokenizer.ggml.add_bos_token=bool:false",
                    ((("n_ctx_train", 64), ("add_bos", False)),)),
    "weights": ("keep", "keep"),
    "session_store": ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    "slot_save_path": (str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent)),
    # media inputs
    "media_path": (str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent)),
    "max_image_payload_size": ("1048576", 1048576),
    "max_images": ("4", 4),
    "image_min_tokens": ("64", 64),
    "image_max_tokens": ("256", 256),
    # issue #5: the sampler chain, logit bias, reverse prompts
    "sampling.samplers": ("penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature;"
                          "adaptive_p", "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;"
                          "xtc;temperature;adaptive_p"),
    "sampling.sampler_seq": ("edskypmxta", "edskypmxta"),
    "sampling.top_n_sigma": ("1.5", 1.5),
    "sampling.xtc_probability": ("0.5", 0.5),
    "sampling.xtc_threshold": ("0.2", 0.2),
    "sampling.typical_p": ("0.9", 0.9),
    "sampling.repeat_last_n": ("32", 32),
    "sampling.repeat_penalty": ("1.1", 1.1),
    "sampling.presence_penalty": ("0.5", 0.5),
    "sampling.frequency_penalty": ("0.25", 0.25),
    "sampling.dry_multiplier": ("0.8", 0.8),
    "sampling.dry_base": ("2.0", 2.0),
    "sampling.dry_allowed_length": ("3", 3),
    "sampling.dry_penalty_last_n": ("128", 128),
    "sampling.dry_sequence_breakers": ("none", ("none",)),
    "sampling.adaptive_target": ("0.3", 0.3),
    "sampling.adaptive_decay": ("0.5", 0.5),
    "sampling.dynatemp_range": ("0.5", 0.5),
    "sampling.dynatemp_exp": ("2.0", 2.0),
    "sampling.mirostat": ("2", 2),
    "sampling.mirostat_eta": ("0.2", 0.2),
    "sampling.mirostat_tau": ("3.0", 3.0),
    "sampling.logit_bias": ("15043-inf", ((15043, float("-inf")),)),
    "sampling.reverse_prompt": ("User:", ("User:",)),
    "sampling.grammar": ('root ::= "x"', 'root ::= "x"'),
    "sampling.grammar_file": ("/srv/g.gbnf", "/srv/g.gbnf"),
    "sampling.json_schema": ("{}", "{}"),
    "sampling.json_schema_file": ("/srv/s.json", "/srv/s.json"),
    # issue #7: logging, transport, CORS, key files
    "log_file": ("/var/log/mlxcel.log", "/var/log/mlxcel.log"),
    "log_colors": ("enabled", "on"),
    "log_verbosity": ("5", 5),
    "cors_origins": ("https://a.example,https://b.example", "https://a.example,https://b.example"),
    "cors_methods": ("GET", "GET"),
    "cors_headers": ("Authorization", "Authorization"),
    "api_prefix": ("/api", "/api"),
    "ui_config": ("{\"temperature\": 0}", "{\"temperature\": 0}"),
    "ui_config_file": ("ui.json", "ui.json"),
    "api_key_file": ("/etc/keys", "/etc/keys"),
    "ssl_key_file": ("key.pem", "key.pem"),
    "ssl_cert_file": ("cert.pem", "cert.pem"),
    # speculative decoding
    "spec_type": ("ngram-simple", ("ngram-simple",)),
    "spec_model": ("/srv/draft", "/srv/draft"),
    "spec_lookup_cache_static": ("/srv/static.bin", "/srv/static.bin"),
    "spec_lookup_cache_dynamic": ("/srv/dynamic.bin", "/srv/dynamic.bin"),
    "spec_n_max": ("8", 8),
    "spec_n_min": ("2", 2),
    "spec_p_min": ("0.5", 0.5),
    "spec_ngram_simple_size_n": ("4", 4),
    "spec_ngram_simple_size_m": ("16", 16),
    "spec_ngram_simple_min_hits": ("2", 2),
    "spec_ngram_map_k_size_n": ("5", 5),
    "spec_ngram_map_k_size_m": ("9", 9),
    "spec_ngram_map_k_min_hits": ("3", 3),
    "spec_ngram_map_k4v_size_n": ("6", 6),
    "spec_ngram_map_k4v_size_m": ("10", 10),
    "spec_ngram_map_k4v_min_hits": ("4", 4),
    "spec_ngram_mod_n_min": ("8", 8),
    "spec_ngram_mod_n_max": ("16", 16),
    "spec_ngram_mod_n_match": ("12", 12),
}

LIVE = ("supported", "aliased", "by_design")
# The value options we act on; the rest is covered by test_inventory and
# test_classification.
LIVE_VALUES = [o for o in OPTIONS if o.kind == "value" and o.status in LIVE]
VALUE_SPELLINGS = [(o, s) for o in LIVE_VALUES for s in o.spellings]


def field(config: ServerConfig, dest: str) -> Any:
    head, _, tail = dest.partition(".")
    return getattr(getattr(config, head), tail) if tail else getattr(config, head)


def config_of(argv: list[str], env: dict[str, str] | None = None) -> ServerConfig:
    parsed = parse(argv, env=env or {})
    return build_config(parsed, "/ckpt")


def test_every_value_option_has_a_sample() -> None:
    assert {o.dest for o in LIVE_VALUES} == set(SAMPLES)


@pytest.mark.parametrize(("opt", "spelling"), VALUE_SPELLINGS, ids=lambda x: getattr(x, "name", x))
def test_each_spelling_sets_its_field(opt: Option, spelling: str) -> None:
    raw, want = SAMPLES[opt.dest]
    config = config_of([spelling, raw])
    if opt.dest in ("model", "hf_repo"):
        assert config.model_ref == want
    elif opt.dest == "hf_token":
        assert parse([spelling, raw], env={}).values["hf_token"] == want
    else:
        assert field(config, opt.dest) == want


@pytest.mark.parametrize("opt", [o for o in LIVE_VALUES if o.env], ids=lambda o: o.env)
def test_each_env_binding_sets_its_field(opt: Option) -> None:
    raw, want = SAMPLES[opt.dest]
    parsed = parse([], env={str(opt.env): raw})
    assert parsed.values[opt.dest] == want
    assert parsed.given[opt.dest] == opt.env


@pytest.mark.parametrize("opt", [o for o in LIVE_VALUES if o.env], ids=lambda o: o.env)
def test_command_line_beats_env(opt: Option) -> None:
    raw, want = SAMPLES[opt.dest]
    # The env value is a bad one: the command line must win without reading it.
    parsed = parse([opt.spellings[-1], raw], env={str(opt.env): ""})
    assert parsed.values[opt.dest] == want and parsed.given[opt.dest] == "argv"


def test_defaults_when_nothing_is_given() -> None:
    config = config_of([])
    assert config == ServerConfig(model="/ckpt", model_ref=None)
    assert config.sampling.temperature is None and config.sampling.top_k is None


@pytest.mark.parametrize("spelling", ["-v", "--verbose", "--log-verbose"])
def test_verbose_spellings(spelling: str) -> None:
    assert config_of([spelling]).verbose is True


def test_warmup_pair_last_one_wins() -> None:
    assert config_of(["--no-warmup"]).warmup is False
    assert config_of(["--no-warmup", "--warmup"]).warmup is True
    assert config_of([]).warmup is True


def test_repeated_value_last_one_wins() -> None:
    assert config_of(["--port", "1", "--port", "2"]).port == 2


# ---- upstream's env rules, on a throwaway table -------------------------

TOY = (
    Option(("--flag",), "flag", "a value-less flag", kind="flag", default=False,
           env="LLAMA_ARG_FLAG"),
    Option(("--pair",), "pair", "a bool pair", kind="bool", negations=("--no-pair",),
           default=True, env="LLAMA_ARG_PAIR"),
    Option(("-nn", "--num"), "num", "a number", value=Int(0, 9), metavar="N", default=5,
           env="LLAMA_ARG_NUM"),
    Option(("--secret",), "secret", "hidden", value=Int(0, 9), metavar="N", hidden=True,
           secret=True, env="LLAMA_ARG_SECRET"),
)


def toy(argv: list[str], **env: str) -> Parsed:
    return parse(argv, env=env, table=TOY, prog="toy")


@pytest.mark.parametrize(("text", "fired"), [
    ("on", True), ("enabled", True), ("true", True), ("1", True),
    ("0", False), ("off", False), ("yes", False), ("TRUE", False), ("", False)])
def test_flag_from_env_fires_only_when_truthy(text: str, fired: bool) -> None:
    parsed = toy([], LLAMA_ARG_FLAG=text)
    assert parsed.values["flag"] is fired
    assert ("flag" in parsed.given) is fired


@pytest.mark.parametrize(("text", "value"), [
    ("true", True), ("1", True), ("on", True), ("enabled", True),
    ("false", False), ("0", False), ("off", False), ("disabled", False)])
def test_bool_pair_from_env(text: str, value: bool) -> None:
    assert toy([], LLAMA_ARG_PAIR=text).values["pair"] is value


def test_bool_pair_env_outside_vocabulary_stops_startup() -> None:
    with pytest.raises(CliError) as err:
        toy([], LLAMA_ARG_PAIR="sometimes")
    msg = str(err.value)
    assert "'sometimes'" in msg and "--pair" in msg and "LLAMA_ARG_PAIR" in msg
    assert "disabled" in msg  # the allowed vocabulary is named


@pytest.mark.parametrize("text", ["1", "true", "0", "anything", ""])
def test_negated_env_alias_means_false_whatever_its_value(text: str) -> None:
    parsed = toy([], LLAMA_ARG_NO_PAIR=text, LLAMA_ARG_PAIR="true")
    assert parsed.values["pair"] is False
    assert parsed.given["pair"] == "LLAMA_ARG_NO_PAIR"


def test_command_line_beats_env_for_flags_and_pairs() -> None:
    assert toy(["--pair"], LLAMA_ARG_NO_PAIR="1").values["pair"] is True
    assert toy(["--no-pair"], LLAMA_ARG_PAIR="true").values["pair"] is False


def test_multi_letter_single_dash_spelling() -> None:
    assert toy(["-nn", "3"]).values["num"] == 3


def test_secret_values_are_never_echoed() -> None:
    with pytest.raises(CliError) as err:
        toy(["--secret", "hunter2"])
    assert "hunter2" not in str(err.value) and "<redacted>" in str(err.value)


# ---- errors ----------------------------------------------------------------

@pytest.mark.parametrize(("argv", "name", "domain"), [
    (["--port", "abc"], "--port", "[0, 65535]"),
    (["--port", "70000"], "--port", "[0, 65535]"),
    (["-c", "-5"], "--ctx-size", "[0, 2147483647]"),
    (["-b", "0"], "--batch-size", "[1, 2147483647]"),
    (["-n", "-2"], "--predict", "[-1, 2147483647]"),
    (["--temp", "nan"], "--temp", "finite"),
    (["-s", "x"], "--seed", "integer"),
])
def test_bad_value_names_option_value_reason_and_domain(argv: list[str], name: str, domain: str) -> None:
    with pytest.raises(CliError) as err:
        parse(argv, env={})
    msg = str(err.value)
    assert "\n" not in msg
    assert name in msg and repr(argv[1]) in msg and domain in msg
    assert "not an integer" in msg or "out of range" in msg or "number" in msg


def test_bad_env_value_names_the_variable() -> None:
    with pytest.raises(CliError, match=r"--port \(from LLAMA_ARG_PORT\)"):
        parse([], env={"LLAMA_ARG_PORT": "http"})


def test_a_long_option_may_spell_its_dashes_as_underscores() -> None:
    # upstream reads "_" as "-" in every "--" argument it looks up
    p = parse(["--ctx_size", "128", "--cache_reuse=4", "--no_slots", "-a", "x_y",
               "--reverse_prompt=--a_b"], env={})
    assert (p.values["ctx_size"], p.values["cache_reuse"]) == (128, 4)
    assert p.values["endpoint_slots"] is False and p.values["aliases"] == ("x_y",)
    # values are never rewritten, and an unknown name stays refused as typed
    assert p.values["sampling.reverse_prompt"] == ("--a_b",)
    with pytest.raises(CliError, match="invalid argument: --bogus_flag "):
        parse(["--bogus_flag"], env={})


@pytest.mark.parametrize("argv", [["--ctx", "10"], ["--por", "1"], ["--paral", "2"], ["--bogus"],
                                  ["stray"], ["-ng", "5"], ["-n5"], ["-ngl5"], ["-ct", "q8_0"],
                                  ["-hfx", "a/b"]])
def test_unknown_and_abbreviated_options_are_refused(argv: list[str]) -> None:
    with pytest.raises(CliError, match=f"invalid argument: {argv[0]} "):
        parse(argv, env={})


def test_missing_value_is_one_line() -> None:
    with pytest.raises(CliError, match="--port needs a value"):
        parse(["--port"], env={})


def test_parser_is_argparse_without_abbreviations() -> None:
    parser = build_parser()
    assert isinstance(parser, argparse.ArgumentParser)
    assert parser.allow_abbrev is False and parser.add_help is False


@pytest.mark.parametrize(("argv", "action"), [
    (["-h"], "help"), (["--usage"], "help"), (["--version"], "version"),
    (["--dump-flag-surface"], "dump_flag_surface")])
def test_actions_skip_env_parsing(argv: list[str], action: str) -> None:
    parsed = parse(argv, env={"LLAMA_ARG_PORT": "not-a-port"})
    assert parsed.action == action

"""The chat options (cli/options_chat.py) and the settings they resolve to
(chat/settings.py): startup refusals before any model resolves, the
template kwargs the reasoning flags write, the template in force."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mlxcel_trio.chat import settings
from mlxcel_trio.cli.main import build_config, prepare
from mlxcel_trio.cli.parser import CliError, parse
from .._checkpoint import fake_checkpoint


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    return fake_checkpoint(tmp_path / "ckpt", {"num_hidden_layers": 2})


def refusal(argv, ckpt, env=None) -> str | None:
    try:
        prepare([*argv, "-m", str(ckpt)], env=env or {})
    except CliError as exc:
        return str(exc)
    return None


def config(argv, env=None):
    return build_config(parse(argv, env=env or {}), "/ckpt")


@pytest.mark.parametrize("name", ["chatml", "llama3", "deepseek3", "mistral-v7-tekken"])
def test_builtin_template_names_are_accepted(name, ckpt, tmp_path):
    f = tmp_path / "t.jinja"
    f.write_text(name)
    for jinja in ([], ["--jinja"], ["--no-jinja"]):
        assert refusal([*jinja, "--chat-template", name], ckpt) is None
        assert refusal([*jinja, "--chat-template-file", str(f)], ckpt) is None
        assert refusal(jinja, ckpt, env={"LLAMA_ARG_CHAT_TEMPLATE": name}) is None
    assert config(["--no-jinja", "--chat-template", name]).chat_template == name


def test_no_jinja_needs_a_template_it_recognises(ckpt, tmp_path):
    line = refusal(["--no-jinja", "--chat-template", "{{ messages }}"], ckpt)
    assert line.startswith("--chat-template '{{ messages }}': the supplied chat template is "
                           "not supported")
    assert "drop --no-jinja" in line
    f = tmp_path / "t.jinja"
    f.write_text("{{ messages }}")
    assert refusal(["--chat-template-file", str(f), "--no-jinja"], ckpt).startswith(
        "--chat-template-file")
    assert refusal(["--chat-template", "{{ messages }}"], ckpt) is None  # Jinja renders it
    # a name must match whole, as upstream's table lookup
    assert refusal(["--no-jinja", "--chat-template", " llama3"], ckpt) is not None
    # recognised template text passes
    assert refusal(["--no-jinja", "--chat-template", "{{ '<|im_start|>' }}"], ckpt) is None
    env = {"LLAMA_ARG_JINJA": "0", "LLAMA_ARG_CHAT_TEMPLATE": "hello"}
    assert "(from LLAMA_ARG_CHAT_TEMPLATE)" in refusal([], ckpt, env=env)


def test_bad_templates_stop_startup(ckpt, tmp_path):
    assert "does not compile" in refusal(["--chat-template", "{% if %}"], ckpt)
    assert "cannot read" in refusal(["--chat-template-file", str(tmp_path / "nope")], ckpt)
    bad = tmp_path / "bad.jinja"
    bad.write_bytes(b"\xff\xfe{{")
    assert "cannot read" in refusal(["--chat-template-file", str(bad)], ckpt)


def test_templates_and_kwargs_are_accepted(ckpt, tmp_path):
    f = tmp_path / "t.jinja"
    f.write_text("{{ messages[0].content }}")
    assert refusal(["--chat-template", "{{ x }}", "--chat-template-file", str(f),
                    "--chat-template-kwargs", '{"a": [1]}'], ckpt) is None
    cfg = config(["--chat-template-file", str(f), "--chat-template-kwargs", '{"a": 1}'])
    assert cfg.chat_template_file == str(f) and cfg.chat_template_kwargs == '{"a": 1}'


@pytest.mark.parametrize("value", ["x", "[1]", "{bad"])
def test_kwargs_must_be_a_json_object(value, ckpt):
    line = refusal(["--chat-template-kwargs", value], ckpt)
    assert line.startswith("invalid value") and "--chat-template-kwargs" in line


def test_jinja_and_no_jinja_are_accepted(ckpt):
    assert refusal(["--jinja"], ckpt) is None
    assert refusal(["--no-jinja"], ckpt) is None
    assert refusal([], ckpt, env={"LLAMA_ARG_NO_JINJA": "1"}) is None
    assert config(["--no-jinja"]).chat_jinja is False
    assert config([], {"LLAMA_ARG_JINJA": "0"}).chat_jinja is False
    assert config([]).chat_jinja is True


@pytest.mark.parametrize("text, want", [("on", "on"), ("enabled", "on"), ("1", "on"),
                                        ("true", "on"), ("off", "off"), ("0", "off"),
                                        ("disabled", "off"), ("auto", "auto"), ("-1", "auto")])
def test_reasoning_spellings(text, want):
    assert config(["--reasoning", text]).chat_reasoning == want
    assert config([], {"LLAMA_ARG_REASONING": text}).chat_reasoning == want


def test_reasoning_rejects_other_words(ckpt):
    assert "--reasoning" in refusal(["-rea", "maybe"], ckpt)


def test_reasoning_budget_options(ckpt):
    cfg = config(["--reasoning-budget", "10", "--reasoning-budget-message", "Stop."])
    assert (cfg.chat_reasoning_budget, cfg.chat_reasoning_budget_message) == (10, "Stop.")
    assert config([]).chat_reasoning_budget == -1
    assert "--reasoning-budget" in refusal(["--reasoning-budget", "-2"], ckpt)
    assert refusal(["--reasoning-budget", "0"], ckpt) is None


def test_dedicated_flags_write_template_kwargs():
    cfg = config(["--reasoning", "off", "--reasoning-effort", "low", "--reasoning-preserve",
                  "--chat-template-kwargs", '{"custom": "x"}'])
    assert settings.template_kwargs(cfg) == {"custom": "x", "enable_thinking": False,
                                             "reasoning_effort": "low",
                                             "preserve_reasoning": True}
    assert settings.template_kwargs(config([])) == {}
    assert settings.template_kwargs(config(["--no-reasoning-preserve"])) == \
        {"preserve_reasoning": False}


def test_a_dedicated_flag_wins_a_collision_and_says_so(caplog):
    cfg = config(["--reasoning", "on", "--chat-template-kwargs", '{"enable_thinking": false}'])
    with caplog.at_level(logging.WARNING, logger="mlxcel.chat"):
        assert settings.template_kwargs(cfg) == {"enable_thinking": True}
    assert "enable_thinking" in caplog.text and "wins" in caplog.text


class _Vocab:
    chat_template = "checkpoint"
    chat_template_tool_use = None
    special_tokens_map = {"eos_token": "</s>"}


def test_template_in_force(tmp_path, caplog):
    f = tmp_path / "t.jinja"
    f.write_text("from file")
    assert settings.template_source(config([]), _Vocab) == ("checkpoint", None)
    assert settings.template_source(config(["--chat-template-file", str(f)]), _Vocab)[0] == \
        "from file"
    with caplog.at_level(logging.WARNING, logger="mlxcel.chat"):
        both = config(["--chat-template", "inline", "--chat-template-file", str(f)])
        assert settings.template_source(both, _Vocab)[0] == "inline"
    assert "inline template wins" in caplog.text
    none = type("V", (_Vocab,), {"chat_template": None})
    assert "<|im_start|>" in settings.template_source(config([]), none)[0]


@pytest.mark.parametrize("path, fmt", [
    ("Qwen-Qwen3-0.6B", "hermes"), ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "hermes"),
    ("meta-llama-Llama-3.1-8B-Instruct", "llama3"), ("meta-llama-Llama-3.2-3B-Instruct", "llama3"),
    ("google-gemma-2-2b-it", None),
])
def test_tool_format_from_template(path, fmt):
    f = Path(__file__).resolve().parents[4] / "shared/upstream/chat-templates" / f"{path}.jinja"
    if not f.exists():
        pytest.skip("../shared/upstream/chat-templates is absent")
    got = settings.tool_format(f.read_text())
    # a variant of a table dialect (Hermes 3 renders no reasoning_content, so
    # its thoughts keep their raw newline) still carries the family's name
    assert (got if got is None or isinstance(got, str) else got.name) == fmt


def test_fixture_template_format_and_markers():
    src = (Path(__file__).resolve().parents[3] / "fixtures/chat_template.jinja").read_text()
    assert settings.tool_format(src) == "hermes"
    assert settings.think_markers(src) == ("<think>", "</think>")


def test_typed_content_probe():
    from mlxcel_trio.chat.template import ChatTemplate
    assert settings.renders_typed_content(ChatTemplate(
        (Path(__file__).resolve().parents[3] / "fixtures/chat_template.jinja").read_text()))
    assert not settings.renders_typed_content(ChatTemplate(
        "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% endif %}"
        "{% endfor %}"))


def test_template_caps_probe_real_families():
    from mlxcel_trio.chat.template import ChatTemplate
    root = Path(__file__).resolve().parents[4] / "shared/upstream/chat-templates"
    if not root.is_dir():
        pytest.skip("../shared/upstream/chat-templates is absent")
    caps = {name: settings.template_caps(ChatTemplate((root / f"{name}.jinja").read_text(),
                                                      {"bos_token": "<s>", "eos_token": "</s>"}))
            for name in ("Qwen-Qwen3-0.6B", "google-gemma-2-2b-it", "openai-gpt-oss-120b")}
    assert list(caps["Qwen-Qwen3-0.6B"]) == sorted(caps["Qwen-Qwen3-0.6B"])
    assert caps["Qwen-Qwen3-0.6B"]["supports_tools"] and \
        caps["Qwen-Qwen3-0.6B"]["supports_parallel_tool_calls"]
    assert not caps["Qwen-Qwen3-0.6B"]["supports_typed_content"]
    assert not caps["google-gemma-2-2b-it"]["supports_system_role"]
    assert not caps["google-gemma-2-2b-it"]["supports_tools"]
    assert caps["openai-gpt-oss-120b"]["supports_reasoning_effort"]


# -- the path in force ---------------------------------------------------------------------

_QWENISH = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n" \
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>{% endif %}"


def _vocab(template, tool_use=None):
    return type("V", (), {"chat_template": template, "chat_template_tool_use": tool_use,
                          "special_tokens_map": {"eos_token": "</s>"}})


def test_the_jinja_path_by_default():
    chat = settings.build(config([]), _vocab(_QWENISH, "tool use"))
    assert chat.jinja and chat.legacy is None and chat.thinks
    assert chat.template.tool_use_source == "tool use"


def test_no_jinja_detects_the_format_from_the_checkpoint_template():
    chat = settings.build(config(["--no-jinja"]), _vocab(_QWENISH, "tool use"))
    assert (chat.jinja, chat.legacy, chat.named) == (False, "chatml", False)
    assert chat.skip_parsing and not chat.thinks and chat.tool_format is None
    # /props reports the template text, and no tool-use variant off Jinja (as upstream)
    assert chat.template.source == _QWENISH and chat.template.tool_use_source is None


def test_no_jinja_with_an_unrecognised_template_still_starts(caplog):
    with caplog.at_level(logging.WARNING, logger="mlxcel.chat"):
        chat = settings.build(config(["--no-jinja"]), _vocab("{{ messages }}"))
    assert (chat.jinja, chat.legacy) == (False, None)
    assert "--jinja" in caplog.text


def test_a_builtin_name_under_jinja_selects_its_format():
    chat = settings.build(config(["--chat-template", "llama3"]), _vocab(_QWENISH))
    assert (chat.jinja, chat.legacy, chat.named) == (False, "llama3", True)
    assert chat.template.source == "llama3"  # what /props reports, as upstream


def test_chatml_is_upstreams_chatml_template_on_both_paths():
    from mlxcel_trio.chat.template import CHATML
    jinja = settings.build(config(["--chat-template", "chatml"]), _vocab(_QWENISH))
    assert jinja.jinja and jinja.template.source == CHATML
    legacy = settings.build(config(["--no-jinja", "--chat-template", "chatml"]), _vocab(None))
    assert (legacy.jinja, legacy.legacy) == (False, "chatml")
    assert legacy.template.source == CHATML

"""--ui / --no-ui and the web UI's default settings (--ui-config,
--ui-config-file): resolved before the model, into ServerConfig.ui and the
JSON text /props reports as ui_settings (cli/main.py `ui_settings`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlxcel_trio.cli.main import prepare
from mlxcel_trio.cli.parser import CliError

from .._checkpoint import fake_checkpoint


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    return fake_checkpoint(tmp_path / "ckpt", {"num_hidden_layers": 4})


def settings(argv: list[str], ckpt: Path, env: dict[str, str] | None = None):
    config = prepare([*argv, "-m", str(ckpt)], env=env or {})
    return json.loads(config.ui_settings)


@pytest.fixture
def ui_file(tmp_path: Path) -> Path:
    path = tmp_path / "ui.json"
    path.write_text('{"top_k": 5, "systemMessage": "Be brief."}', encoding="utf-8")
    return path


@pytest.mark.parametrize(("argv", "env", "ui"), [
    ([], {}, True), (["--no-ui"], {}, False), (["--no-webui"], {}, False), (["--webui"], {}, True),
    ([], {"LLAMA_ARG_UI": "0"}, False), ([], {"LLAMA_ARG_NO_UI": "1"}, False),
    (["--ui"], {"LLAMA_ARG_UI": "false"}, True),
])
def test_the_ui_is_on_by_default_and_can_be_turned_off(argv, env, ui, ckpt: Path) -> None:
    assert prepare([*argv, "-m", str(ckpt)], env=env).ui is ui


def test_no_settings_is_an_empty_object(ckpt: Path) -> None:
    assert settings([], ckpt) == {}


@pytest.mark.parametrize("spelling", ["--ui-config", "--webui-config"])
def test_the_json_text_is_reported(spelling: str, ckpt: Path) -> None:
    assert settings([spelling, '{"temperature": 0, "max_tokens": 64}'], ckpt) == {
        "temperature": 0, "max_tokens": 64}


@pytest.mark.parametrize("spelling", ["--ui-config-file", "--webui-config-file"])
def test_the_file_is_read_and_reported(spelling: str, ui_file: Path, ckpt: Path) -> None:
    assert settings([spelling, str(ui_file)], ckpt) == {"top_k": 5, "systemMessage": "Be brief."}
    assert settings([], ckpt, {"LLAMA_ARG_UI_CONFIG_FILE": str(ui_file)})["top_k"] == 5


def test_the_later_of_config_and_file_wins(ui_file: Path, ckpt: Path) -> None:
    text = '{"top_k": 9}'
    assert settings(["--ui-config-file", str(ui_file), "--ui-config", text], ckpt) == {"top_k": 9}
    assert settings(["--ui-config", text, "--ui-config-file", str(ui_file)], ckpt)["top_k"] == 5
    # the command line beats the environment, whichever option each names
    env = {"LLAMA_ARG_UI_CONFIG_FILE": str(ui_file)}
    assert settings(["--ui-config", text], ckpt, env) == {"top_k": 9}
    env = {"LLAMA_ARG_UI_CONFIG": text}
    assert settings(["--ui-config-file", str(ui_file)], ckpt, env)["top_k"] == 5
    # both from the environment: the file, as upstream applies them in table order
    env = {"LLAMA_ARG_UI_CONFIG": text, "LLAMA_ARG_UI_CONFIG_FILE": str(ui_file)}
    assert settings([], ckpt, env)["top_k"] == 5


@pytest.mark.parametrize(("argv", "needle"), [
    (["--ui-config", "{bad"], "--ui-config '{bad': failed to parse UI config"),
    (["--ui-config", "NaN"], "--ui-config 'NaN': failed to parse UI config"),
    (["--ui-config-file", "/nonexistent/ui.json"],
     "--ui-config-file '/nonexistent/ui.json': failed to open file"),
])
def test_bad_settings_stop_startup_before_the_model(argv: list[str], needle: str) -> None:
    # an unreachable repo id: resolving it would be a different error
    with pytest.raises(CliError) as err:
        prepare([*argv, "-m", "nobody-xyz/not-a-repo"], env={"HF_HUB_OFFLINE": "1"})
    (line,) = err.value.lines
    assert line.startswith(needle) and "; " in line, line


def test_a_bad_file_names_the_variable(tmp_path: Path) -> None:
    path = tmp_path / "ui.json"
    path.write_text("[1, 2", encoding="utf-8")
    with pytest.raises(CliError) as err:
        prepare(["-m", "nobody-xyz/not-a-repo"],
                env={"HF_HUB_OFFLINE": "1", "LLAMA_ARG_UI_CONFIG_FILE": str(path)})
    assert "(from LLAMA_ARG_UI_CONFIG_FILE): failed to parse UI config" in err.value.lines[0]

"""cli/sinks.py: the log destination, key files, the TLS pair and the
secrets, all resolved before the model reference (an unreachable repo id
here: resolving it would be a different error)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from mlxcel_trio.cli.main import prepare
from mlxcel_trio.cli.parser import CliError
from mlxcel_trio.cli.sinks import read_key_file
from .._checkpoint import fake_checkpoint

UNREACHABLE = ["-m", "nobody-xyz/not-a-repo"]


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    return fake_checkpoint(tmp_path / "ckpt", {"num_hidden_layers": 2})


def refusal(argv: list[str], env: dict | None = None) -> str:
    with pytest.raises(CliError) as err:
        prepare([*argv, *UNREACHABLE], env={"HF_HUB_OFFLINE": "1", **(env or {})})
    line = str(err.value)
    assert "nobody-xyz" not in line and "\n" not in line
    return line


def test_log_file_refusals_name_option_and_path(tmp_path: Path) -> None:
    target = tmp_path / "real.log"
    target.write_text("")
    (tmp_path / "link.log").symlink_to(target)
    cases = {tmp_path / "link.log": "symbolic link", tmp_path: "is a directory",
             tmp_path / "no" / "x.log": "does not exist"}
    for path, why in cases.items():
        line = refusal(["--log-file", str(path)])
        assert line.startswith(f"--log-file {str(path)!r}: ") and why in line
    line = refusal([], env={"LLAMA_ARG_LOG_FILE": str(tmp_path)})
    assert "(from LLAMA_ARG_LOG_FILE)" in line
    line = refusal([], env={"LLAMA_LOG_FILE": str(tmp_path)})
    assert "(from LLAMA_LOG_FILE)" in line


def test_log_destination_precedence(tmp_path: Path, ckpt: Path) -> None:
    a, b, c = (str(tmp_path / n) for n in ("a.log", "b.log", "c.log"))
    env = {"LLAMA_ARG_LOG_FILE": b, "LLAMA_LOG_FILE": c}
    assert prepare(["-m", str(ckpt), "--log-file", a], env=env).log_file == a
    assert prepare(["-m", str(ckpt)], env=env).log_file == b
    assert prepare(["-m", str(ckpt)], env={"LLAMA_LOG_FILE": c}).log_file == c
    assert prepare(["-m", str(ckpt)], env={}).log_file is None
    off = prepare(["-m", str(ckpt), "--log-disable", "--log-file", str(tmp_path / "d.log")],
                  env=env)
    assert off.log_disable and off.log_file is None and not (tmp_path / "d.log").exists()
    for name in ("a.log", "b.log", "c.log"):  # created where chosen, 0600
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o600


def test_key_file_lines_comments_and_merge(tmp_path: Path, ckpt: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# a comment\nkey-one\n\n  spaced \nkey-two")
    assert read_key_file(str(keys)) == ["key-one", "  spaced ", "key-two"]
    config = prepare(["-m", str(ckpt), "--api-key", "flag-key", "--api-key-file", str(keys)],
                     env={})
    assert config.api_keys == ("flag-key", "key-one", "  spaced ", "key-two")
    assert "# a comment" not in config.api_keys
    env_config = prepare(["-m", str(ckpt)], env={"LLAMA_ARG_API_KEY_FILE": str(keys)})
    assert env_config.api_keys == ("key-one", "  spaced ", "key-two")


def test_missing_key_file_is_refused(tmp_path: Path) -> None:
    line = refusal(["--api-key-file", str(tmp_path / "nope")])
    assert line.startswith(f"--api-key-file {str(tmp_path / 'nope')!r}: failed to open file")


def test_tls_needs_both_files_that_load(tmp_path: Path) -> None:
    pem = tmp_path / "x.pem"
    pem.write_text("not a pem")
    assert "HTTPS needs both" in refusal(["--ssl-key-file", str(pem)])
    assert "give --ssl-key-file too" in refusal(["--ssl-cert-file", str(pem)])
    assert "cannot be read" in refusal(["--ssl-key-file", str(tmp_path / "no"),
                                        "--ssl-cert-file", str(pem)])
    assert "do not load together" in refusal(["--ssl-key-file", str(pem),
                                              "--ssl-cert-file", str(pem)])


def test_every_secret_is_registered(tmp_path: Path, ckpt: Path) -> None:
    used, other = tmp_path / "used", tmp_path / "other"
    used.write_text("file-key\n# not-a-key\n")
    other.write_text("env-file-key\n")
    config = prepare(["-m", str(ckpt), "--api-key", "flag-key", "--api-key-file", str(used),
                      "--hf-token", "hf_flag"],
                     env={"LLAMA_API_KEY": "env-key,env-key-2", "HF_TOKEN": "hf_env",
                          "LLAMA_ARG_API_KEY_FILE": str(other)})
    assert set(config.secrets) == {"flag-key", "file-key", "env-key", "env-key-2", "hf_flag",
                                   "hf_env", "env-file-key"}
    assert "flag-key" not in repr(config)

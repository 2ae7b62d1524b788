"""--session-store (MLXCEL_SESSION_STORE), mlxcel-trio's own option: an
unusable URL stops startup before anything loads, naming the option, the
value without its password, and the alternative; the password is on the
log redaction list; memory is the default."""

from __future__ import annotations

import pytest

from mlxcel_trio.cli import sinks
from mlxcel_trio.cli.options import BY_DEST
from mlxcel_trio.cli.parser import help_text, parse

from ._proc import run_cli

BAD = [
    ("http://cache:6379", "expected memory, file://DIR, or a redis://"),
    ("redis://:6379/0", "names no host"),
    ("redis://cache:6379/zero", "the database must be a number"),
    ("redis://:s3cret@cache:99999/0", "not a URL"),
]


@pytest.mark.parametrize(("url", "needle"), BAD)
def test_an_unusable_url_stops_startup_in_one_line(url: str, needle: str) -> None:
    run = run_cli(["-m", "x", "--session-store", url])
    assert run.rc == 1 and len(run.stderr_lines) == 1, run.stderr
    line = run.stderr_lines[0]
    assert line.startswith("error: --session-store ") and needle in line
    assert "s3cret" not in run.stderr
    assert run.seconds < 1.0


def test_the_variable_is_named_and_the_password_never_shown() -> None:
    run = run_cli(["-m", "x"], MLXCEL_SESSION_STORE="redis://:s3cret@cache:6379/db")
    assert run.rc == 1 and "(from MLXCEL_SESSION_STORE)" in run.stderr
    assert "redis://cache:6379/db" in run.stderr and "s3cret" not in run.stderr


def test_memory_is_the_default_and_help_says_what_it_is() -> None:
    opt = BY_DEST["session_store"]
    assert (opt.default, opt.env, opt.upstream, opt.secret) == (
        "memory", "MLXCEL_SESSION_STORE", False, True)
    text = help_text(opt)
    assert "rediss://" in text and "(default: memory)" in text


def test_the_password_is_redacted_from_logs() -> None:
    parsed = parse(["-m", "x", "--session-store", "rediss://u:s3cret@cache:6380/1"], env={})
    assert "s3cret" in sinks.secret_values(parsed, {}, [])


def test_a_file_store_that_is_not_a_directory_stops_startup(tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    run = run_cli(["-m", "x", "--session-store", f"file://{blocker}"])
    assert run.rc == 1 and len(run.stderr_lines) == 1, run.stderr
    line = run.stderr_lines[0]
    assert line.startswith(f"error: --session-store 'file://{blocker}'")
    assert "is not a directory" in line and "or memory" in line


def test_a_file_store_directory_is_created_and_accepted(tmp_path) -> None:
    from mlxcel_trio import store_url

    target = tmp_path / "new" / "sessions"
    assert store_url.problem(f"file://{target}") is None
    assert target.is_dir() and store_url.file_dir(f"file://{target}") == str(target)

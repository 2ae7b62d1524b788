"""logging_setup: the log file's safety rules, line-buffered redaction, the
verbosity mapping and upstream's line shape (no processes; the same rules
against real processes are in tests/e2e/test_logging.py)."""

from __future__ import annotations

import io
import logging
import os
import re
import stat

import pytest

from mlxcel_trio.logging_setup import (
    TRACE, LogFileError, Redactor, RedactingStream, UpstreamFormatter, level_for, open_log_file,
)


def test_a_new_log_file_is_private_and_appended(tmp_path):
    path = tmp_path / "server.log"
    with open_log_file(str(path)) as f:
        f.write("one\n")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open_log_file(str(path)) as f:
        f.write("two\n")
    assert path.read_text() == "one\ntwo\n"


def test_an_existing_log_file_is_tightened_to_0600(tmp_path):
    path = tmp_path / "server.log"
    path.write_text("kept\n")
    os.chmod(path, 0o644)
    open_log_file(str(path)).close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and path.read_text() == "kept\n"


def test_unusable_log_destinations_are_refused(tmp_path):
    target = tmp_path / "target"
    target.write_text("")
    (tmp_path / "link").symlink_to(target)
    os.mkfifo(tmp_path / "fifo")
    cases = {"link": "symbolic link", "": "is a directory", "missing/x.log": "does not exist",
             "fifo": "cannot be opened"}
    for name, why in cases.items():
        with pytest.raises(LogFileError, match=why):
            open_log_file(str(tmp_path / name))
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(LogFileError, match="symbolic link"):
        open_log_file(str(tmp_path / "dangling"))
    assert not (tmp_path / "nowhere").exists()


def test_a_secret_split_across_writes_is_still_redacted():
    raw = io.StringIO()
    out = RedactingStream(raw, Redactor(["s3cr3t-canary", "ab"]))
    for piece in ("key: s3c", "r3t-ca", "nary and ", "a", "b\r", "s3cr3t-", "canary", "\n"):
        out.write(piece)
    assert raw.getvalue() == "key: [redacted] and [redacted]\r[redacted]\n"
    out.write("tail s3cr3t-canary")  # held until the end of the line ...
    assert "tail" not in raw.getvalue()
    out.drain()                      # ... or the exit
    assert raw.getvalue().endswith("tail [redacted]")


def test_redactor_prefers_the_longest_secret_and_ignores_empty_ones():
    redact = Redactor(["", "key", "key-long", "multi\nline"])
    assert redact("key-long key line multi") == "[redacted] [redacted] [redacted] [redacted]"
    assert Redactor([])("unchanged") == "unchanged"


@pytest.mark.parametrize(("threshold", "verbose", "level"), [
    (-1, False, logging.CRITICAL + 1), (0, False, logging.CRITICAL + 1),
    (1, False, logging.ERROR), (2, False, logging.WARNING), (3, False, logging.INFO),
    (4, False, TRACE), (5, False, logging.DEBUG), (99, False, logging.DEBUG),
    (1, True, logging.DEBUG), (0, True, logging.DEBUG),
])
def test_upstream_thresholds_map_onto_levels(threshold, verbose, level):
    assert level_for(threshold, verbose) == level


def _line(level: int, **kw) -> str:
    fmt = UpstreamFormatter(**{"prefix": True, "timestamps": True, "colors": False,
                               "t_start": 1000.0, **kw})
    record = logging.LogRecord("mlxcel.x", level, __file__, 1, "hello %s", ("there",), None)
    record.created = 1000.0 + 61.234567
    return fmt.format(record)


def test_line_shape_follows_upstream():
    assert _line(logging.INFO) == "1.01.234.567 I mlxcel.x: hello there"
    assert _line(TRACE) == "1.01.234.567 I mlxcel.x: hello there"
    assert _line(logging.WARNING, timestamps=False) == "W mlxcel.x: hello there"
    assert _line(logging.ERROR, timestamps=False) == "E mlxcel.x: hello there"
    assert _line(logging.DEBUG, timestamps=False) == "D mlxcel.x: hello there"
    # the timestamp belongs to the prefix, as upstream
    assert _line(logging.INFO, prefix=False) == "mlxcel.x: hello there"


def test_colors_use_upstreams_palette():
    assert _line(logging.INFO, colors=True) == \
        "\033[34m1.01.234.567\033[0m \033[32mI \033[0mmlxcel.x: hello there"
    assert re.fullmatch(r"\033\[35mW mlxcel\.x: hello there\033\[0m",
                        _line(logging.WARNING, colors=True, timestamps=False))
    assert _line(logging.ERROR, colors=True, timestamps=False).startswith("\033[31mE ")

"""Pytest plugin: run llama.cpp's server test suite on a local checkpoint.

The suite's server presets name checkpoints on the Hugging Face hub
(``model_hf_repo`` / ``model_hf_file``, sometimes ``model_url``) and its
session fixture downloads every one of them before the first test.  This
plugin, loaded with ``-p local_checkpoint`` from the suite's directory,
replaces both:

* every server the suite starts that names a checkpoint at all is started
  on ``CONFORMANCE_MODEL`` instead (``--model PATH``, no hub flags), so
  the binary under test always loads the checkpoint made for it: a GGUF
  file for ``llama-server``, an MLX directory for ``mlxcel-server``;
  a server that names none (a router) is left as it is;
* the download-everything fixture fetches nothing; it only makes the
  suite's ``tmp/`` directory, which that download would have made and
  which some tests pass to the server (``--slot-save-path ./tmp``);
* every test phase (setup, call, teardown) runs under an alarm of
  ``CONFORMANCE_TEST_TIMEOUT`` seconds (default 120): a test that hangs on
  a server fails with a timeout and the run goes on.

The binary itself is chosen by the suite's own ``LLAMA_SERVER_BIN_PATH``;
``scripts/conformance/upstream_suite.py`` sets all three variables.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

MODEL_ENV = "CONFORMANCE_MODEL"
TIMEOUT_ENV = "CONFORMANCE_TEST_TIMEOUT"
DEFAULT_TIMEOUT_S = 120

# The attributes of the suite's server object that name where a checkpoint
# comes from.  Any one of them set means "this server serves a model".
_SOURCE_ATTRS = ("model_hf_repo", "model_hf_file", "model_url", "model_file")


class ConformanceTimeout(Exception):
    """A test phase ran past the per-test timeout."""


def _checkpoint() -> str:
    path = os.environ.get(MODEL_ENV)
    if not path:
        raise pytest.UsageError(f"{MODEL_ENV} must name the local checkpoint")
    if not Path(path).exists():
        raise pytest.UsageError(f"{MODEL_ENV}={path}: no such file or directory")
    return path


def point_at_checkpoint(server: Any, checkpoint: str) -> None:
    """Make ``server`` load ``checkpoint`` if it would load any model."""
    if not any(getattr(server, attr, None) for attr in _SOURCE_ATTRS):
        return
    server.model_hf_repo = None
    server.model_hf_file = None
    server.model_url = None
    server.model_file = checkpoint


def pytest_configure(config: pytest.Config) -> None:
    checkpoint = _checkpoint()
    # The suite's conftest does `from utils import *` with the suite's
    # directory on sys.path; importing it here first gives both the same
    # module object, so the patches below are the ones its tests see.
    sys.path.insert(0, str(Path.cwd()))
    import utils  # type: ignore[import-not-found]

    original_start = utils.ServerProcess.start

    def start(self: Any, *args: Any, **kwargs: Any) -> None:
        point_at_checkpoint(self, checkpoint)
        return original_start(self, *args, **kwargs)

    utils.ServerProcess.start = start
    utils.ServerPreset.load_all = staticmethod(lambda: os.makedirs(utils.TMP_DIR, exist_ok=True))
    config.addinivalue_line("markers", "conformance: local-checkpoint run")


def _timeout_s() -> float:
    return float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))


def _on_alarm(signum: int, frame: Any) -> None:
    raise ConformanceTimeout(f"test phase ran past {_timeout_s():g} s")


def _under_alarm() -> Iterator[None]:
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, _timeout_s())
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _under_alarm()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _under_alarm()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield from _under_alarm()

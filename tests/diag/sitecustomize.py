"""Loaded by every Python process the tests start (tests/conftest.py puts
this folder on PYTHONPATH): SIGUSR1 makes a server print every thread's
stack to stderr, so a test that timed out waiting on it can show where the
server stood (conftest's failure report sends it)."""

import faulthandler
import os
import signal

if os.environ.get("MLXCEL_TEST_STACKS") == "1":
    faulthandler.register(signal.SIGUSR1, all_threads=True)

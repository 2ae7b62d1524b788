"""Run a cli entry point as a real process, as an operator would."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

BIN = Path(sys.executable).parent


@attrs.frozen
class Run:
    rc: int
    stdout: str
    stderr: str
    seconds: float   # the child's CPU time (user + system): robust to a busy machine

    @property
    def stderr_lines(self) -> list[str]:
        return self.stderr.splitlines()


def clean_env(**extra: str) -> dict[str, str]:
    """The current environment minus every LLAMA_* variable, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_")}
    env.update(extra)
    return env


def run_cli(args: list[str], *, script: str | None = None, **env: str) -> Run:
    """Run `python -m mlxcel_trio ARGS`, or a console script."""
    if script is None:
        cmd = [sys.executable, "-m", "mlxcel_trio", *args]
    else:
        path = BIN / script
        if not path.exists():
            pytest.skip(f"console script {script} is not installed in this venv")
        cmd = [str(path), *args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(**env), timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Run(proc.returncode, proc.stdout, proc.stderr, cpu)

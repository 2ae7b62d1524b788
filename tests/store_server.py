"""A real Valkey / Redis server for the shared session store tests.

`StoreServer` runs `valkey-server` (or `redis-server`) on a free loopback
port with no persistence, so a restart starts empty, as a crashed store
would.  Tests that need one skip, naming the missing binary, when neither is
installed (.ci/run installs one).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest

from tests.conftest import free_port

BINARIES = ("valkey-server", "redis-server")
START_S = 10.0


def binary() -> str | None:
    return next((path for name in BINARIES if (path := shutil.which(name))), None)


def require() -> str:
    path = binary()
    if path is None:
        pytest.skip("neither valkey-server nor redis-server is installed "
                    "(apt-get install valkey-server, or redis-server)")
    try:
        import redis  # noqa: F401
    except ImportError:
        pytest.skip("the redis client is not installed (pip install 'mlxcel-trio[redis]')")
    return path


class StoreServer:
    def __init__(self, password: str | None = None) -> None:
        self.binary = require()
        self.port = free_port()
        self.password = password
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> StoreServer:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_S
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"{self.binary} did not listen on {self.port} within "
                                         f"{START_S} s (exit {self.proc.poll()})") from None
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def client(self):
        import redis
        return redis.Redis.from_url(self.url)


@pytest.fixture(scope="module")
def store_server():
    server = StoreServer().start()
    yield server
    server.stop()

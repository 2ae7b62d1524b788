"""The clean-install check: run by a fresh venv's python after `pip install .`
(no extras), from outside the checkout, so the installed package is what is
imported.  Three steps, each bounded, each failing with one line that says
what a plain install lacks:

1. every module of the installed package imports; a module may fail only on
   a package that one of the feature extras (OPTIONAL below) brings, never on
   one that only the test extra declares;
2. router mode starts (`mlxcel-server --models-dir DIR`) and forwards one
   completion to the model's own server;
3. an image is fetched over loopback through the server's media reader.

    .venv-clean/bin/python .ci/clean_install_check.py
"""

from __future__ import annotations

import http.server
import importlib
import importlib.metadata
import os
import pkgutil
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# import name -> the extra that declares it (pyproject.toml's optional-dependencies)
OPTIONAL = {"PIL": "media", "mlx_vlm": "media", "soundfile": "media", "scipy": "media",
            "redis": "redis"}
PACKAGES = ("mlxcel_trio", "fixtures")
SKIP = ("__main__",)                    # runs the server when imported
BOOT_SECONDS = 120


def fail(message: str) -> None:
    print(f"clean install: {message}", file=sys.stderr)
    raise SystemExit(1)


def declared_extras() -> set[str]:
    return set(importlib.metadata.metadata("mlxcel-trio").get_all("Provides-Extra") or ())


def import_everything() -> int:
    extras = declared_extras()
    for name, extra in OPTIONAL.items():
        if extra not in extras:
            fail(f"{name} is listed as the {extra!r} extra's, which pyproject.toml does not declare")
    count, problems = 0, []
    for top in PACKAGES:
        package = importlib.import_module(top)
        where = Path(package.__file__).parent
        if ".venv" not in str(where) and "site-packages" not in str(where):
            fail(f"{top} was imported from {where}, not from the installed package")
        for info in pkgutil.walk_packages(package.__path__, top + "."):
            if info.name.rsplit(".", 1)[-1] in SKIP:
                continue
            try:
                importlib.import_module(info.name)
                count += 1
            except ModuleNotFoundError as exc:
                missing = (exc.name or "").split(".")[0]
                if missing not in OPTIONAL:
                    problems.append(f"{info.name} imports {missing}, which `pip install .` "
                                    "does not install: declare it in pyproject.toml's "
                                    "dependencies")
    if problems:
        fail("\n  ".join(["missing runtime dependencies:", *problems]))
    return count


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, log: Path, seconds: float) -> None:
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            fail(f"the router exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    fail(f"{url} did not answer 200 within {seconds:.0f} s:\n{log.read_text()[-3000:]}")


def router_forwards(work: Path) -> None:
    import httpx

    from fixtures.build import ensure

    models = work / "models"
    models.mkdir()
    shutil.copytree(ensure("tiny"), models / "tiny")
    port, log = free_port(), work / "router.log"
    server = shutil.which("mlxcel-server", path=str(Path(sys.executable).parent))
    if server is None:
        fail("the mlxcel-server console script is not installed")
    env = {**os.environ, "HF_HUB_CACHE": str(work / "hub"), "HF_HUB_OFFLINE": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen([server, "--models-dir", str(models), "--host", "127.0.0.1",
                                 "--port", str(port), "-c", "512", "-np", "1"],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/v1/models", proc, log, BOOT_SECONDS)
        res = httpx.post(url + "/completion", timeout=BOOT_SECONDS,
                         json={"model": "tiny", "prompt": "hello", "n_predict": 4})
        if res.status_code != 200 or "content" not in res.json():
            fail(f"a completion through the router answered {res.status_code}: {res.text[:500]}")
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def image_fetched() -> None:
    import trio

    from mlxcel_trio.media import MediaPolicy, read_media

    # a 1x1 PNG
    png = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                        "1f15c4890000000d49444154789c6360f8cf000000020001e221bc33"
                        "0000000049454e44ae426082")

    class One(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(png)))
            self.end_headers()
            self.wfile.write(png)

        def log_message(self, *args) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), One)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/cat.png"
        got = trio.run(read_media, url, MediaPolicy(allow_private=True, timeout=10.0))
    finally:
        httpd.shutdown()
    if got != png:
        fail(f"the image fetched over loopback differs ({len(got)} bytes, {len(png)} served)")


def main() -> None:
    start = time.monotonic()
    count = import_everything()
    with tempfile.TemporaryDirectory(prefix="mlxcel-clean-") as tmp:
        router_forwards(Path(tmp))
    image_fetched()
    print(f"clean install: {count} modules imported, router mode forwarded a completion, "
          f"an image was fetched over loopback ({time.monotonic() - start:.0f} s)")


if __name__ == "__main__":
    main()

"""A Hugging Face Hub on 127.0.0.1 for download tests (HF_ENDPOINT): the
endpoints the pinned huggingface_hub calls for a snapshot (model info by
revision, the file tree, HEAD and GET of each file by commit), serving
fixture directories as repositories, plus the failures a real Hub shows:

    owner/name      -> a directory: served
    test/gated      -> 401 everywhere
    test/dropped    -> the listing works, the weights' body stops halfway
    anything else   -> 404
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, repos: dict[str, Path]) -> None:
        self.repos = dict(repos)
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._answer(self, head=True)

            def do_GET(self) -> None:
                hub._answer(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- answers ------------------------------------------------------------------

    def _repo(self, path: str) -> tuple[str | None, str]:
        """(repo id, the rest of the path) for /api/models/<repo>/... or /<repo>/resolve/..."""
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            return "/".join(parts[2:4]), "/".join(parts[4:])
        if len(parts) >= 3 and parts[2] == "resolve":
            return "/".join(parts[:2]), "/".join(parts[2:])
        return None, path

    def _answer(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        path = h.path.split("?", 1)[0]
        self.requests.append(f"{h.command} {path}")
        repo, rest = self._repo(path)
        if repo == "test/gated":
            return self._send(h, 401, b'{"error": "Invalid credentials"}', head,
                              {"X-Error-Code": "GatedRepo"})
        root = self.repos.get(repo or "")
        if root is None and repo != "test/dropped":
            return self._send(h, 404, b'{"error": "Repository not found"}', head,
                              {"X-Error-Code": "RepoNotFound"})
        root = root or self.repos["test/tiny"]
        files = sorted(p.name for p in root.iterdir() if p.is_file())
        if path.startswith("/api/") and rest.startswith("tree/"):
            items = [{"type": "file", "path": f, "size": (root / f).stat().st_size,
                      "oid": hashlib.sha1((root / f).read_bytes()).hexdigest()} for f in files]
            return self._send(h, 200, json.dumps(items).encode(), head)
        if path.startswith("/api/"):
            info = {"id": repo, "modelId": repo, "sha": COMMIT, "private": False,
                    "siblings": [{"rfilename": f} for f in files]}
            return self._send(h, 200, json.dumps(info).encode(), head)
        name = rest.split("/", 2)[-1]
        if name not in files:
            return self._send(h, 404, b"", head, {"X-Error-Code": "EntryNotFound"})
        data = (root / name).read_bytes()
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}
        if repo == "test/dropped" and name.endswith(".safetensors") and not head:
            h.send_response(200)
            for k, v in {**headers, "Content-Length": str(len(data))}.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data[: len(data) // 2])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(2)
            return None
        return self._send(h, 200, data, head, headers)

    @staticmethod
    def _send(h, status: int, body: bytes, head: bool, headers: dict | None = None) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "application/json" if body[:1] in (b"{", b"[") else
                      "application/octet-stream")
        h.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        if not head:
            h.wfile.write(body)

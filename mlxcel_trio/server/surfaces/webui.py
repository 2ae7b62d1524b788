"""The built-in web UI: static files shipped in the package, served as is.

The page (mlxcel_trio/server/webui/) is plain HTML, CSS and JavaScript with
no build step and no external fetch; it talks to the same public API as any
client (/props, /v1/chat/completions, /v1/stream).  What this module adds is
the answer's headers: a Content-Security-Policy that allows scripts, styles
and connections from this origin only (no inline script or style, no
framing), `nosniff`, no referrer, and `no-cache` so a new package version is
picked up on the next load.

The files are read once, when the app is built; a file missing from the
package fails startup there rather than a request later.  Besides the page,
the paths upstream's UI build serves for installing it: sw.js (a worker that
caches and intercepts nothing), manifest.webmanifest, and _app/version.json,
which names this server's version.  URLs inside the
page are relative, so the UI works unchanged under --api-prefix.
"""

from __future__ import annotations

import json
from importlib import resources

from quart import Response

from ... import __version__
from ...protocol.routes import UI_ASSETS, UI_GENERATED, UI_ROUTES

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; manifest-src 'self'; worker-src 'self'; base-uri 'none'; "
       "form-action 'none'; frame-ancestors 'none'")
# upstream's types for the PWA files (its UI embed): manifest+json, json
_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".js": "text/javascript; charset=utf-8",
          ".webmanifest": "application/manifest+json", ".json": "application/json"}
_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache",
            "Cross-Origin-Opener-Policy": "same-origin"}


def _content_type(name: str) -> str:
    return _TYPES[name[name.rindex("."):]]


class Assets:
    """The UI's files, by the path they are served at ("/" is index.html)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    @classmethod
    def load(cls) -> "Assets":
        root = resources.files("mlxcel_trio.server") / "webui"
        files = {name: (root / name).read_bytes() for name in UI_ASSETS}
        files.update(generated())
        return cls(files)

    def answer(self, path: str) -> Response:
        """`path` is a UI route's path (routes.UI_ROUTES), never a request's."""
        name = "index.html" if path == "/" else path.removeprefix("/")
        return Response(self.files[name], status=200, content_type=_content_type(name),
                        headers=_HEADERS)


def generated() -> dict[str, bytes]:
    """The files written at startup (routes.UI_GENERATED)."""
    return {"_app/version.json": json.dumps({"version": __version__}).encode()}


def mount(app, prefix: str) -> frozenset[str]:
    """--ui: the page's static files under --api-prefix (a single server and
    the router alike); the full paths, which answer before the model has
    loaded and without the API key (the page asks for the key itself).
    Upstream compares its exemption with the unprefixed paths, which leaves a
    prefixed page unreachable with a key set; here the page is reachable
    under the prefix too."""
    assets = Assets.load()
    paths = set()
    for route in UI_ROUTES:
        path = prefix + route.path

        async def view(route=route):
            return assets.answer(route.path)

        app.add_url_rule(path, f"UI {route.path}", view, methods=["GET"])
        paths.add(path)
    return frozenset(paths)

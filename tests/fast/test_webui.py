"""The web UI's files, in-process (server/surfaces/webui.py, server/app.py):
what / answers with --ui and --no-ui, the headers that keep the page
strict, the API key and loading-gate exemptions, --api-prefix, and
/props' ui / ui_settings.  The page's behaviour in a browser is
tests/e2e/test_webui.py."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from mlxcel_trio import __version__
from mlxcel_trio.protocol.routes import UI_ASSETS, UI_GENERATED, UI_ROUTES
from mlxcel_trio.server.surfaces.webui import CSP

from .conftest import error_of

route = pytest.mark.route
TYPES = {"html": "text/html; charset=utf-8", "css": "text/css; charset=utf-8",
         "js": "text/javascript; charset=utf-8", "webmanifest": "application/manifest+json",
         "json": "application/json"}
LOADING = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}


def _files() -> dict[str, str]:
    root = resources.files("mlxcel_trio.server") / "webui"
    return {p.name: p.read_text(encoding="utf-8") for p in root.iterdir() if p.is_file()}


def test_the_route_table_names_exactly_the_shipped_files():
    assert sorted(_files()) == sorted(UI_ASSETS)
    assert [r.path for r in UI_ROUTES] == ["/", *("/" + name for name in UI_ASSETS + UI_GENERATED)]


def test_the_package_data_ships_every_file():
    import tomllib
    from fnmatch import fnmatch
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["mlxcel_trio.server"]
    for name in UI_ASSETS:
        assert any(fnmatch("webui/" + name, p) for p in patterns), name


def test_the_page_loads_nothing_from_elsewhere_and_has_no_inline_code():
    files = _files()
    for name, text in files.items():
        assert not re.search(r"(https?:)?//[\w.-]+\.\w", re.sub(r"//.*|/\*[\s\S]*?\*/", "", text)
                             if name.endswith(".js") else text), f"{name} names another origin"
    html = files["index.html"]
    for tag in re.findall(r"<script\b[^>]*>[\s\S]*?</script>", html):
        assert re.match(r'<script src="[\w.-]+\.js" defer></script>$', tag), tag
    assert not re.search(r"<style\b|\sstyle=|\son\w+=", html)
    assert "innerHTML" not in files["app.js"] + files["markdown.js"]


@route("GET /props")
async def test_every_file_answers_with_the_strict_headers(serve):
    s = await serve()
    for r in UI_ROUTES:
        resp = await s.get(r.path)
        assert resp.status_code == 200, r.path
        name = "index.html" if r.path == "/" else r.path[1:]
        assert resp.content_type == TYPES[name.rsplit(".", 1)[1]], r.path
        if name in UI_GENERATED:
            continue
        assert await resp.get_data() == (resources.files("mlxcel_trio.server") / "webui" /
                                         name).read_bytes()
        assert resp.headers["Content-Security-Policy"] == CSP
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert resp.headers["Cache-Control"] == "no-cache"
    assert "script-src 'self';" in CSP and "'unsafe-inline'" not in CSP
    props = await (await s.get("/props")).get_json()
    assert props["ui"] is True and props["ui_settings"] == {}


async def test_the_install_files_describe_this_server_and_cache_nothing(serve):
    s = await serve()
    assert await (await s.get("/_app/version.json")).get_json() == {"version": __version__}
    manifest = await (await s.get("/manifest.webmanifest")).get_json(force=True)
    assert manifest["name"] == "mlxcel-trio" and manifest["start_url"] == "./"
    worker = (await (await s.get("/sw.js")).get_data()).decode()
    # nothing intercepted, nothing stored: API answers never come from a cache
    assert "'fetch'" not in worker and ".put(" not in worker and "addAll" not in worker
    assert 'rel="manifest" href="manifest.webmanifest"' in _files()["index.html"]


@route("GET /props")
@pytest.mark.parametrize("argv,env", [(("--no-ui",), {}), (("--no-webui",), {}),
                                      ((), {"LLAMA_ARG_UI": "0"})])
async def test_no_ui_answers_404_at_root(serve, argv, env):
    s = await serve(*argv, env=env)
    for path in ("/", "/index.html", "/app.js"):
        r = await s.get(path)
        assert error_of(await r.get_json(), 404, "not_found_error") == "File Not Found"
    props = await (await s.get("/props")).get_json()
    assert props["ui"] is False


@route("GET /props")
async def test_ui_config_is_reported_in_props(serve):
    s = await serve("--ui-config", '{"temperature": 0, "systemMessage": "<b>hi</b>"}')
    props = await (await s.get("/props")).get_json()
    assert props["ui_settings"] == {"temperature": 0, "systemMessage": "<b>hi</b>"}


@route("GET /props")
async def test_the_files_need_no_key_and_answer_while_loading(serve):
    s = await serve("--api-key", "k1", load_error="never loads", wait_loaded=False)
    assert (await s.get("/")).status_code == 200
    assert await (await s.get("/props")).get_json() == LOADING
    s = await serve("--api-key", "k1")
    for r in UI_ROUTES:
        assert (await s.get(r.path)).status_code == 200, r.path
    r = await s.get("/props")
    assert error_of(await r.get_json(), 401, "authentication_error") == "Invalid API Key"
    r = await s.get("/props", headers={"Authorization": "Bearer k1"})
    assert r.status_code == 200


async def test_the_page_moves_under_the_api_prefix(serve):
    s = await serve("--api-prefix", "/llm", "--api-key", "k1")
    assert (await s.get("/llm/")).status_code == 200
    assert (await s.get("/llm/app.js")).status_code == 200
    assert (await s.get("/")).status_code == 401   # not a page path: the key comes first
    assert (await s.get("/", headers={"X-Api-Key": "k1"})).status_code == 404
    r = await s.get("/llm/props", headers={"X-Api-Key": "k1"})
    assert r.status_code == 200 and (await r.get_json())["ui"] is True

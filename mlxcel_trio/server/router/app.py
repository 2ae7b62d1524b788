"""The router's HTTP surface.

Its own routes: /health, GET /models and /v1/models (the inventory with
each model's status), GET /props without ?model= (the router's props),
POST /models/load and /models/unload.  Every other route of the route
table is forwarded to the child serving the model the request names: the
body's `model` on POST, `?model=` on GET (upstream's router contract);
`?autoload=` overrides --models-autoload per request.  The stream-session
routes reach the child that took the session's first request (by its
X-Conversation-Id).  The API-key gate and CORS are the single-model
server's own.
"""

from __future__ import annotations

import json
import logging
import re
import time

import trio

from quart import Response, request
from quart_trio import QuartTrio

from ...config import ServerConfig
from ...model_store import hub_cache_dir
from ...protocol.routes import ROUTES, quart_rule
from ..http.app_shell import BUILD_INFO, PerRequest, answer_errors, api_key_index, shell_app
from ..http.cors import CorsMiddleware, CorsPolicy
from ..http.errors import invalid_api_key, json_response, router_error
from ..surfaces import webui
from . import catalog, proxy
from .pool import Pool

log = logging.getLogger("mlxcel.router")

# answered by the router itself (everything else in ROUTES is forwarded)
OWN = {("GET", "/health"), ("GET", "/v1/health"), ("GET", "/models"), ("GET", "/v1/models"),
       ("GET", "/props")}
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
STREAM_ROUTES = {("GET", "/v1/stream"), ("DELETE", "/v1/stream"), ("POST", "/v1/streams/lookup")}
CONV_HEADER = "X-Conversation-Id"
CONV_MEMORY = 4096  # conversation ids remembered for the stream routes (oldest dropped)


def inventory(pool: Pool) -> dict:
    """upstream's router listing: one OpenAI model object per model, with
    its status and the input modalities its config says it takes (upstream
    also merges the loaded child's own facts in; not here yet)."""
    now = int(time.time())
    data = []
    for inst in pool.instances.values():
        status: dict = {"value": inst.status, "args": list(inst.args)}
        if inst.failed:
            status.update(exit_code=inst.exit_code, failed=True)
        entry = {"id": inst.name, "aliases": list(inst.entry.aliases),
                 "tags": list(inst.entry.tags), "object": "model",
                 "owned_by": "llamacpp", "created": now, "status": status,
                 "architecture": {"input_modalities": list(pool.inputs(inst)),
                                  "output_modalities": ["text"]},
                 "source": inst.entry.source, "can_remove": inst.entry.source == "cache"}
        data.append(entry)
    return {"data": data, "object": "list"}


def create_router_app(config: ServerConfig, pool: Pool, env) -> QuartTrio:
    app = shell_app("mlxcel_trio.router", config)
    keys = [k.encode() for k in config.api_keys]
    prefix = config.api_prefix
    # the web UI lists the router's models in a picker (webui/app.js), as upstream's
    ui_paths = webui.mount(app, prefix) if config.ui else frozenset()
    public = {r.path for r in ROUTES if r.public} | ui_paths
    http = proxy.client()
    app.mlxcel_http = http
    conversations: dict[str, str] = {}  # conv id -> model, for the stream routes

    def autoload() -> bool:
        given = request.args.get("autoload")
        return config.models_autoload if given is None else given in ("true", "1")

    def known(name: str) -> str:
        """upstream's router_validate_model."""
        if not name:
            raise router_error("model_missing")
        canonical = pool.resolve(name)
        if canonical is None:
            raise router_error("model_unknown", name=name)
        name = canonical
        if not autoload() and pool.instances[name].status != "loaded":
            raise router_error("model_not_loaded")
        return name

    async def to_child(name: str, body: bytes) -> Response:
        inst = await pool.ready(name) if autoload() else pool.instances[name]
        return await proxy.forward(http, inst, request.method, request.path,
                                   request.query_string, request.headers.items(), body)

    async def forward_post():
        body = await request.get_data()
        try:
            parsed = json.loads(body) if body else {}
        except ValueError:
            raise router_error("body_not_json") from None
        name = known(parsed.get("model", "") if isinstance(parsed, dict) else "")
        conv = request.headers.get(CONV_HEADER)
        if conv:
            conversations[conv] = name
            while len(conversations) > CONV_MEMORY:
                conversations.pop(next(iter(conversations)))
        return await to_child(name, body)

    async def forward_get():
        return await to_child(known(request.args.get("model", "")), b"")

    async def forward_stream():
        body = await request.get_data()
        conv = request.args.get("conv_id") or request.headers.get(CONV_HEADER)
        if not conv and body:
            try:
                conv = json.loads(body).get("conv_id")
            except (ValueError, AttributeError):
                conv = None
        name = conversations.get(conv or "")
        inst = pool.instances.get(name or "")
        if inst is None or inst.status != "loaded":
            raise router_error("stream_unknown")
        return await proxy.forward(http, inst, request.method, request.path,
                                   request.query_string, request.headers.items(), body)

    async def health():
        return json_response({"status": "ok"})

    async def models():
        if request.args.get("reload"):
            pool.update(catalog.discover(config.models_dir, env, config.presets))
            pool.notify("models_reload", "*")
        return json_response(inventory(pool))

    async def add():
        """POST /models: upstream's order: the name, then the Hub's answer
        about it, then whether it is here already; the download runs on."""
        from ... import downloads

        body = await request.get_json(force=True, silent=True)
        name = body.get("model") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            raise router_error("model_not_string")
        if "/" not in name:  # a bare name: mlx-community's, as -m expands it
            name = f"mlx-community/{name}"
        if not _REPO_ID.fullmatch(name) or ".." in name:
            raise router_error("not_a_repo_id", name=name)
        token = config.hf_token or env.get("HF_TOKEN") or None
        try:
            await trio.to_thread.run_sync(lambda: downloads.probe(name, token))
        except downloads.DownloadError as exc:
            raise router_error("download_refused", why=str(exc)) from None
        if pool.resolve(name) is not None:
            raise router_error("model_exists", name=name)
        await pool.download(name, hub_cache_dir(env), token)
        return json_response({"success": True})

    async def remove():
        name = request.args.get("model", "")
        if not name:
            raise router_error("model_not_string")
        await pool.remove(name, hub_cache_dir(env))
        return json_response({"success": True})

    async def events():
        """GET /models/sse: one `data:` frame per pool event until the
        client leaves (or is too slow to keep up)."""
        receive = pool.watch()

        async def frames():
            async with receive:
                async for message in receive:
                    yield f"data: {json.dumps(message)}\n\n".encode()
        resp = Response(frames(), content_type="text/event-stream")
        resp.timeout = None
        return resp

    async def props():
        if request.args.get("model"):
            return await forward_get()
        return json_response({
            "role": "router", "max_instances": config.models_max,
            "models_autoload": config.models_autoload, "model_alias": "llama-server",
            "model_path": "none", "default_generation_settings": {"params": {}, "n_ctx": 0},
            "ui_settings": {}, "build_info": BUILD_INFO, "cors_proxy_enabled": False})

    async def named(unknown: str):
        """The instance the body's "model" names, or `unknown`'s error."""
        body = await request.get_json(force=True, silent=True) or {}
        name = pool.resolve(body.get("model", "") if isinstance(body, dict) else "")
        inst = pool.instances.get(name or "")
        if inst is None:
            raise router_error(unknown)
        return inst

    async def load():
        inst = await named("load_unknown")
        if inst.running:
            raise router_error("already_running")
        pool.start(inst)
        return json_response({"success": True})

    async def unload():
        inst = await named("unload_unknown")
        if not inst.running:
            raise router_error("not_running")
        pool.stop(inst)
        return json_response({"success": True})

    own = {"/health": health, "/v1/health": health, "/models": models, "/v1/models": models,
           "/props": props, "/models/load": load, "/models/unload": unload,
           "/models/sse": events}
    for route in ROUTES:
        if route.vertex:
            continue
        key = (route.method, route.path)
        view = (remove if key == ("DELETE", "/models") else add if key == ("POST", "/models")
                else own[route.path] if key in OWN or route.router
                else forward_stream if key in STREAM_ROUTES
                else forward_post if route.method == "POST" else forward_get)
        app.add_url_rule(prefix + quart_rule(route.path), f"{route.method} {route.path}",
                         _ignore_params(view), methods=[route.method])

    @app.before_request
    async def _gate():
        if keys and request.path not in public:
            if api_key_index(keys) < 0:
                log.warning("unauthorized: Invalid API Key")
                return invalid_api_key()
        return None

    answer_errors(app, config)

    policy = CorsPolicy(config.cors_origins, config.cors_methods, config.cors_headers,
                        config.cors_credentials)
    app.asgi_app = CorsMiddleware(PerRequest(app.asgi_app), policy, [("Server", "llama.cpp")])
    return app


def _ignore_params(view):
    """Path parameters (`/slots/:id_slot`) travel in the forwarded path."""
    async def wrapped(**_params):
        return await view()
    wrapped.__name__ = view.__name__
    return wrapped

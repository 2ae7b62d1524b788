"""The QuartTrio application: middleware, error boundary, route mounting.

Request flow, in upstream's order: CORS (outermost ASGI layer: stamps
Access-Control-Allow-Origin, answers every OPTIONS itself) -> ASGI wrapper
(the request's resources, http/resources.py) -> loading gate (503 until the
engine reports Loaded) -> API key check -> handler.  Routes are mounted
under --api-prefix; the key exemption compares the full path, so a prefixed
/health needs the key, as upstream.  Every exception becomes an
upstream-shaped error; unknown paths and wrong methods are both upstream's
404 "File Not Found" (there is no 405).  A body over MAX_BODY_BYTES is a 413
before it is read (a route carrying inline media has the larger ceiling its
image budget implies: http/body_limits.py), one not complete within
--timeout a 408.  The wrapper, the error answers and the key check are
http/app_shell.py's, which the router's app uses too.

What lives as long as the app (sessions, registries, chat settings) is one
`AppState` (server/state.py), built here and exposed as `app.mlxcel_state`
for the runner, which runs its detached-work nursery and stream sweep.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable

from quart import g, request
from quart_trio import QuartTrio

from ..bridge import Bridge
from ..config import ServerConfig
from ..protocol.routes import ROUTES, Route, quart_rule
from .surfaces import (info, infill, completion as native, embeddings, openai_completions,
                       tokens, transcriptions)
from .http import limits
from .sessions import slot_files, streams, takeover
from .http import request_tape
from .state import AppState
from . import drain
from .surfaces.vertex import Predictor
from .surfaces.metrics import Metrics
from .surfaces import chat_routes, lora, webui
from .request.jobs import server_defaults
from .request.served import Served
from .http.app_shell import BUILD_INFO, PerRequest, answer_errors, api_key_index, shell_app
from .http.body import read_json_body
from .http.cors import CorsMiddleware, CorsPolicy
from .http.half_close import HalfClosePolicy
from .http.errors import (
    ApiError,
    feature_disabled,
    invalid_api_key,
    loading,
    not_generating,
    not_supported,
    shutting_down,
)
from .http.key_scope import caller_scope

log = logging.getLogger("mlxcel.http")



def create_app(bridge: Bridge, config: ServerConfig, model_name: str) -> QuartTrio:
    app = shell_app("mlxcel_trio", config)
    keys = [k.encode() for k in config.api_keys]
    state = app.mlxcel_state = AppState.create(config, bridge)
    public = {r.path for r in ROUTES if r.public}
    served: Served | None = None
    metrics = Metrics(bridge, state.watchdog, state.takeover)

    def ctx() -> Served:
        nonlocal served
        if served is None:  # the defaults need the vocabulary: built after the load
            served = Served(bridge, model_name, server_defaults(config, bridge.vocab), BUILD_INFO,
                            n_predict_cap=config.sampling.n_predict, n_slots=config.slots,
                            batch_size=config.batch_size, spm_infill=config.spm_infill,
                            speculative=config.speculative, state=state)
        return served

    async def read_body():
        """The JSON body, for a handler that decides first whether to read it."""
        body = await read_json_body(request)
        limits.check(body)
        return body

    # Each entry takes the body first when its Route has `body`, then the
    # route's path parameters by name (routes.py).
    handlers: dict[str, Callable[..., Any]] = {
        "health": lambda: info.health(),
        "props": lambda: info.props(ctx()),
        "models": lambda: info.models(ctx(), config.aliases, config.tags),
        "slots": lambda: info.slots(bridge, request.args),
        "metrics": lambda: metrics.scrape(),
        "set_props": lambda: info.set_props(config),
        "completion": lambda body: native.complete(ctx(), body),
        "v1_completions": lambda body: openai_completions.complete_v1(
            ctx(), body, caller_scope()),
        "infill": lambda body: infill.infill(ctx(), body),
        "tokenize": lambda body: tokens.tokenize(ctx(), body),
        "detokenize": lambda body: tokens.detokenize(bridge.vocab, body),
        "slot_actions": ((lambda id_slot: slot_files.handle(
                             bridge, config.slot_save_path, id_slot, state.slot_identities))
                         if config.slot_save_path else
                         (lambda id_slot: not_supported("slots action", "--slot-save-path"))),
        "embeddings": lambda: embeddings.embeddings(ctx(), config.embd_normalize, read_body,
                                                    oai=False),
        "v1_embeddings": lambda: embeddings.embeddings(ctx(), config.embd_normalize, read_body,
                                                       oai=True),
        "rerank": lambda: embeddings.rerank(ctx(), read_body),
        "feature_disabled": feature_disabled,
        "lora_adapters": lambda: lora.list_adapters(state.adapters),
        "set_lora_adapters": lambda body: lora.set_adapters(state.adapters, body),
        "transcriptions": lambda: transcriptions.transcribe(ctx()),
        "stream_get": lambda: streams.get_stream(state.streams),
        "stream_delete": lambda: streams.delete_stream(state.streams),
        "streams_lookup": lambda: streams.lookup_streams(state.streams),
        **chat_routes.handlers(ctx, config, state),
    }

    def mount(route: Route) -> None:
        fn = handlers[route.handler]
        # a handler that cannot take what its route passes fails here, at startup
        inspect.signature(fn).bind(*((None,) if route.body else ()),
                                   **dict.fromkeys(route.params, ""))

        async def view(**path_params):
            if route.generates and not bridge.info.generates:
                if bridge.info.transcriber is not None:
                    return transcriptions.no_chat_model()
                return not_generating(config.encoder_mode or "--embeddings")
            if route.wakes and (failed := await bridge.wake()) is not None:
                raise ApiError.from_failed(failed)
            if state.shared.continues or request.headers.get(streams.HEADER):
                # its draws, for a continuation (a resumable stream, a background response)
                request_tape.start(takeover.played(request.scope))
            if route.body:
                body = await read_json_body(request)
                limits.check(body)
                result = fn(body, **path_params)
            else:
                result = fn(**path_params)
            if hasattr(result, "__await__"):
                result = await result
            return result

        app.add_url_rule(config.api_prefix + quart_rule(route.path),
                         f"{route.method} {route.path}", view, methods=[route.method])

    for route in ROUTES:
        if not (route.vertex or route.router):
            mount(route)

    predictor = _mount_vertex(app, config) if config.aip_predict_route else None
    ui_paths = webui.mount(app, config.api_prefix) if config.ui else frozenset()

    @app.before_request
    async def _gate():
        if request.path in ui_paths:  # the page loads first, then asks for the key
            return None
        if not bridge.ready:
            return loading()
        if state.draining:
            return shutting_down(drain.MESSAGE)
        internal = takeover.continuation(request.scope)
        if internal is not None:   # a killed server's stream, rebuilt in this process
            g.key_scope = internal.key_scope
            return None
        if keys and request.path not in public:
            which = api_key_index(keys)
            if which < 0:
                log.warning("unauthorized: Invalid API Key")
                return invalid_api_key()
            if len(keys) > 1:  # per-key state is scoped to the key (server/http/key_scope.py)
                g.key_scope = which
        return None

    answer_errors(app, config)

    policy = CorsPolicy(config.cors_origins, config.cors_methods, config.cors_headers,
                        config.cors_credentials)
    half_close = HalfClosePolicy(ROUTES, config.api_prefix, extra=(
        [("POST", config.aip_predict_route)] if config.aip_predict_route
        else ()))
    inner = PerRequest(app.asgi_app, state.watchdog, half_close)
    if predictor is not None:  # instances are dispatched below CORS, through the gate
        predictor.asgi = inner
    if state.takeover is not None:  # so are continued streams
        state.takeover.asgi = inner
    app.asgi_app = CorsMiddleware(inner, policy, [("Server", "llama.cpp")])
    return app


def _mount_vertex(app: QuartTrio, config: ServerConfig) -> Predictor:
    """AIP_MODE=PREDICTION: the predict fan-out and the optional health
    alias (neither is exempt from --api-key, as upstream)."""
    prefix = config.api_prefix
    predictor = Predictor(None, prefix)

    async def predict():
        return await predictor.predict(await request.get_data(), request.scope)

    app.add_url_rule(prefix + config.aip_predict_route, "POST $AIP_PREDICT_ROUTE", predict,
                     methods=["POST"])
    async def health():
        return info.health()

    if config.aip_health_route:
        app.add_url_rule(prefix + config.aip_health_route, "GET $AIP_HEALTH_ROUTE", health,
                         methods=["GET"])
    return predictor

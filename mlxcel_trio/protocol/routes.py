"""The route table: the one list of (method, path) pairs the server mounts.

The app registers exactly these; the API-key middleware reads `public`
from here; Vertex AI's @requestFormat aliases are derived from it; the
compatibility manifest's route claims are checked against it.  A route with
`vertex` set is registered only under AIP_MODE=PREDICTION, at the path its
AIP_* variable names (cli/vertex_env.py); its `path` here is the placeholder.

The web UI's static files (`UI_ROUTES`) are a table of their own: upstream
counts them outside its route inventory (they exist only when the UI is
on), so the manifest covers them through the --ui option rather than as
route entries.  They are mounted only with --ui (the default), answer
before the model has loaded, and are exempt from --api-key: the page asks
for the key itself (server/surfaces/webui.py).
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Route:
    """The handler named here is called with the parsed JSON body first when
    `body` is set (read within the body limits before the handler runs),
    then each `:name` path parameter by name; a route without `body` that
    needs one reads it itself (stubs answer without reading it)."""

    method: str
    path: str
    handler: str          # a key of the handler table built in server/app.py
    public: bool = False  # exempt from --api-key (upstream: the health routes only)
    vertex: bool = False  # AIP_MODE=PREDICTION only; the path comes from the environment
    body: bool = False    # the handler takes the request's JSON body
    generates: bool = False  # runs the chat model: 501 on an --embeddings / --reranking server
    router: bool = False  # mounted only in router mode (server/router/app.py), as upstream
    media: bool = False   # the body may carry inline media: its size limit follows the
                          # image budget (server/http/body_limits.py)
    upload: bool = False  # a multipart audio upload: one clip's limit (body_limits.py)
    quiet: bool = False   # polled by monitors: no per-request access line (at any method)
    wakes: bool = False   # waits for a sleeping engine to reload first: upstream's handler
                          # reads the model's context (its create_response() without the
                          # sleep bypass), though ours answers from the tokenizer alone

    @property
    def params(self) -> tuple[str, ...]:
        """The path parameters, by name (`/slots/:id_slot` -> ("id_slot",))."""
        return tuple(p[1:] for p in self.path.split("/") if p.startswith(":"))


ROUTES: tuple[Route, ...] = (
    Route("GET", "/health", "health", public=True, quiet=True),
    Route("GET", "/v1/health", "health", public=True, quiet=True),
    Route("GET", "/props", "props", quiet=True),
    Route("GET", "/models", "models", quiet=True),
    Route("GET", "/v1/models", "models", quiet=True),
    Route("GET", "/slots", "slots", wakes=True),
    Route("GET", "/metrics", "metrics", quiet=True),
    Route("POST", "/props", "set_props", wakes=True),
    Route("POST", "/completion", "completion", body=True, generates=True),
    Route("POST", "/completions", "completion", body=True, generates=True),
    Route("POST", "/v1/completions", "v1_completions", body=True, generates=True),
    Route("POST", "/infill", "infill", body=True, generates=True),
    Route("POST", "/tokenize", "tokenize", body=True, wakes=True),
    Route("POST", "/detokenize", "detokenize", body=True, wakes=True),
    # chat surfaces (handlers in server/surfaces/chat_routes.py)
    Route("POST", "/chat/completions", "chat_completions", body=True, generates=True, media=True),
    Route("POST", "/v1/chat/completions", "chat_completions", body=True, generates=True, media=True),
    Route("POST", "/apply-template", "apply_template", body=True, wakes=True),
    Route("POST", "/chat/completions/input_tokens", "chat_input_tokens", body=True, media=True,
          wakes=True),
    Route("POST", "/v1/chat/completions/input_tokens", "chat_input_tokens", body=True, media=True,
          wakes=True),
    Route("POST", "/v1/messages", "anthropic_messages", body=True, generates=True, media=True),
    Route("POST", "/v1/messages/count_tokens", "anthropic_count_tokens", body=True, media=True,
          wakes=True),
    Route("POST", "/v1/responses", "responses", body=True, generates=True, media=True),
    Route("POST", "/responses", "responses", body=True, generates=True, media=True),
    Route("POST", "/responses/input_tokens", "responses_input_tokens", body=True, media=True,
          wakes=True),
    Route("POST", "/v1/responses/input_tokens", "responses_input_tokens", body=True, media=True,
          wakes=True),
    # streams that survive reconnects (X-Conversation-Id; server/sessions/streams.py)
    Route("GET", "/v1/stream", "stream_get"),
    Route("DELETE", "/v1/stream", "stream_delete"),
    Route("POST", "/v1/streams/lookup", "streams_lookup"),
    # mlxcel-only: OpenAI's stored-response routes (manifest: mlxcel-extensions.json)
    Route("GET", "/v1/responses/:response_id", "responses_retrieve"),
    Route("POST", "/v1/responses/:response_id/cancel", "responses_cancel"),
    # realtime reasoning control
    Route("POST", "/v1/chat/completions/control", "chat_control", body=True),
    Route("POST", "/slots/:id_slot", "slot_actions"),
    # embeddings and reranking (server/surfaces/embeddings.py): answered as
    # llama-server answers them without --embeddings / --reranking unless the
    # engine serves an encoder; the body is read only after that check
    Route("POST", "/embedding", "embeddings"),
    Route("POST", "/embeddings", "embeddings"),
    Route("POST", "/v1/embeddings", "v1_embeddings"),
    Route("POST", "/rerank", "rerank"),
    Route("POST", "/reranking", "rerank"),
    Route("POST", "/v1/rerank", "rerank"),
    Route("POST", "/v1/reranking", "rerank"),
    # always mounted upstream; answered as a server without the feature
    # answers unless it is on
    Route("GET", "/lora-adapters", "lora_adapters", wakes=True),
    Route("POST", "/lora-adapters", "set_lora_adapters", body=True, wakes=True),
    # speech to text (server/surfaces/transcriptions.py): upstream's 501
    # unless -m is a Whisper checkpoint; the multipart body is read after that
    Route("POST", "/v1/audio/transcriptions", "transcriptions", upload=True),
    Route("POST", "/audio/transcriptions", "transcriptions", upload=True),
    Route("GET", "/tools", "feature_disabled"),
    Route("POST", "/tools", "feature_disabled"),
    Route("GET", "/cors-proxy", "feature_disabled"),
    Route("POST", "/cors-proxy", "feature_disabled"),
    # router mode only (--models-dir without -m; server/router/)
    Route("POST", "/models/load", "models_load", router=True),
    Route("POST", "/models/unload", "models_unload", router=True),
    Route("GET", "/models/sse", "models_events", router=True),
    Route("DELETE", "/models", "models_remove", router=True),
    Route("POST", "/models", "models_add", router=True),
    # Vertex AI (cli/vertex_env.py, server/surfaces/vertex.py)
    Route("GET", "$AIP_HEALTH_ROUTE", "health", vertex=True),
    Route("POST", "$AIP_PREDICT_ROUTE", "vertex_predict", vertex=True),
)

# the paths whose requests leave no access line, as upstream's request logger skips its
# polled paths (a quiet route's path, at any method)
QUIET_PATHS = frozenset(r.path for r in ROUTES if r.quiet)


# The files of mlxcel_trio/server/webui/, served at /<name>; index.html is also "/".
# sw.js and manifest.webmanifest sit where upstream's UI build puts its own.
UI_ASSETS: tuple[str, ...] = ("index.html", "app.css", "app.js", "markdown.js", "sw.js",
                              "manifest.webmanifest")
# Written when the app is built rather than shipped: they name this server's
# version (upstream's UI build writes _app/version.json the same way).
UI_GENERATED: tuple[str, ...] = ("_app/version.json",)

UI_ROUTES: tuple[Route, ...] = (
    Route("GET", "/", "ui_asset", public=True),
    *(Route("GET", "/" + name, "ui_asset", public=True) for name in UI_ASSETS + UI_GENERATED),
)


def quart_rule(path: str) -> str:
    """upstream's `/slots/:id_slot` spelling -> Quart's `/slots/<id_slot>`."""
    return "/".join(f"<{p[1:]}>" if p.startswith(":") else p for p in path.split("/"))

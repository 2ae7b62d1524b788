"""The route table: the one list of (method, path) pairs the server mounts.

The app registers exactly these; the API-key middleware reads `public`
from here; the compatibility manifest's route claims are checked against it.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Route:
    method: str
    path: str
    handler: str          # name of the handler in server/app.py's HANDLERS
    public: bool = False  # exempt from --api-key (upstream: the health routes only)


ROUTES: tuple[Route, ...] = (
    Route("GET", "/health", "health", public=True),
    Route("GET", "/v1/health", "health", public=True),
    Route("GET", "/props", "props"),
    Route("GET", "/models", "models"),
    Route("GET", "/v1/models", "models"),
    Route("GET", "/slots", "slots"),
    Route("POST", "/completion", "completion"),
    Route("POST", "/completions", "completion"),
    Route("POST", "/v1/completions", "v1_completions"),
    Route("POST", "/tokenize", "tokenize"),
    Route("POST", "/detokenize", "detokenize"),
)

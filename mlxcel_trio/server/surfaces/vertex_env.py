"""The AIP_* environment (Vertex AI), read at startup before the model loads.

Kept apart from the predict handler (gcp.py) so the command line can check
it without importing the HTTP stack.  The facts follow llama-server's
gcp_params: AIP_MODE=PREDICTION turns everything on; an unset or empty
variable takes its default; routes get a leading slash.
"""

from __future__ import annotations

from typing import Mapping

import attrs

from ..routes import ROUTES

MAX_INSTANCES = 128


def _env(env: Mapping[str, str], name: str, default: str, slash: bool = False) -> str:
    value = env.get(name) or default  # unset and empty both mean the default
    if slash and value and not value.startswith("/"):
        value = "/" + value
    return value


class GcpConfigError(Exception):
    """An AIP_* setting the server cannot start with."""


@attrs.frozen
class GcpParams:
    enabled: bool = False
    health_path: str = ""      # "" = no alias
    predict_path: str = "/predict"
    port: int = 8080

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "GcpParams":
        if env.get("AIP_MODE") != "PREDICTION":
            return cls()
        raw_port = _env(env, "AIP_HTTP_PORT", "8080")
        try:
            port = int(raw_port)
        except ValueError:
            raise GcpConfigError(f"AIP_HTTP_PORT {raw_port!r}: not a port number; "
                                 "set it to an integer such as 8080") from None
        if not 0 <= port <= 65535:
            raise GcpConfigError(f"AIP_HTTP_PORT {raw_port!r}: out of range; "
                                 "use a port from 1 to 65535")
        params = cls(True, _env(env, "AIP_HEALTH_ROUTE", "", slash=True),
                     _env(env, "AIP_PREDICT_ROUTE", "/predict", slash=True), port)
        if any(r.path == params.predict_path for r in ROUTES if not r.vertex):
            raise GcpConfigError(f"AIP_PREDICT_ROUTE={params.predict_path} conflicts with an "
                                 "existing llama-server route; choose another path")
        return params


def request_format(path: str) -> str:
    """upstream's path_to_gcp_format: drop a leading /v1 and the slash, then
    camelCase on '/', '-' and '_', stopping at a path parameter."""
    s = path[3:] if len(path) > 3 and path.startswith("/v1") else path
    s = s.removeprefix("/")
    out: list[str] = []
    cap = False
    for c in s:
        if c == ":":
            break
        if c in "/-_":
            cap = True
        else:
            out.append(c.upper() if cap else c)
            cap = False
    return "".join(out)


def targets() -> tuple[dict[str, str], dict[str, str]]:
    """(alias -> path, path -> method) from the route table.  A path's first
    registered method serves it (upstream keys its handler map by path).  On
    an alias collision the /v1 route wins ("completions" is /v1/completions),
    where upstream's unordered map leaves the winner unspecified."""
    methods: dict[str, str] = {}
    for r in ROUTES:
        if not r.vertex:
            methods.setdefault(r.path, r.method)
    aliases: dict[str, str] = {}
    for path in methods:
        alias = request_format(path)
        if alias not in aliases or (path.startswith("/v1/") and
                                    not aliases[alias].startswith("/v1/")):
            aliases[alias] = path
    return aliases, methods

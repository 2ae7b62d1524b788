"""The AIP_* environment (Vertex AI), read at startup before the model loads.

Read by the command line's checks (cli/main.py), so a bad value is refused
with the other startup problems, without the server's code; the predict
handler is server/surfaces/vertex.py.  The facts follow llama-server's
gcp_params: AIP_MODE=PREDICTION turns everything on; an unset or empty
variable takes its default; routes get a leading slash.
"""

from __future__ import annotations

from typing import Mapping

import attrs

from ..protocol.routes import ROUTES


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

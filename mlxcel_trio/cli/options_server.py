"""Server options later issues implement: transport, auth and logging
(issue #7); monitoring endpoints, slots, idle sleep and the router (issue #6).

Each is deferred: upstream's default (or the value asking for nothing) is
accepted, anything else is refused naming the issue.
"""

from __future__ import annotations

from typing import Any

from mlxcel_trio.cli.record import Option
from mlxcel_trio.cli.refusals import at_most, below, deferred
from mlxcel_trio.cli.values import Choice, Int, Text

TRANSPORT_ISSUE = 7
ENDPOINTS_ISSUE = 6


def _t(spellings: tuple[str, ...], dest: str, help: str, **kw: Any) -> Option:
    kw.setdefault("section", "server")
    return deferred(spellings, dest, help, issue=TRANSPORT_ISSUE, **kw)


def _e(spellings: tuple[str, ...], dest: str, help: str, **kw: Any) -> Option:
    kw.setdefault("section", "server")
    return deferred(spellings, dest, help, issue=ENDPOINTS_ISSUE, **kw)


LOGGING: tuple[Option, ...] = (
    _t(("--log-disable",), "log_disable", "write no log at all", kind="flag",
       section="common"),
    _t(("--log-file",), "log_file", "write the log to this file", value=Text(),
       metavar="FNAME", env="LLAMA_ARG_LOG_FILE", section="common"),
    _t(("--log-colors",), "log_colors", "colour the log: on, off, or auto (terminal only)",
       value=Choice(("on", "off", "auto")), metavar="[on|off|auto]", default="auto",
       env="LLAMA_ARG_LOG_COLORS", section="common"),
    _t(("-lv", "--verbosity", "--log-verbosity"), "log_verbosity",
       "log threshold: 0 generic, 1 error, 2 warning, 3 info, 4 trace, 5 debug",
       value=Int(), metavar="N", default=3, env="LLAMA_ARG_LOG_VERBOSITY",
       section="common"),
    _t(("--log-prefix",), "log_prefix", "start each log line with its level",
       kind="bool", negations=("--no-log-prefix",), default=True,
       env="LLAMA_ARG_LOG_PREFIX", section="common"),
    _t(("--log-timestamps",), "log_timestamps", "start each log line with a timestamp",
       kind="bool", negations=("--no-log-timestamps",), default=True,
       env="LLAMA_ARG_LOG_TIMESTAMPS", section="common"),
)

TRANSPORT: tuple[Option, ...] = (
    _t(("--reuse-port",), "reuse_port", "let several sockets bind the same port",
       kind="flag", env="LLAMA_ARG_REUSE_PORT", default_text="disabled"),
    _t(("--cors-origins",), "cors_origins", "origins allowed by CORS, comma-separated",
       value=Text(), metavar="ORIGINS", default="*", env="LLAMA_ARG_CORS_ORIGINS"),
    _t(("--cors-methods",), "cors_methods", "methods allowed by CORS, comma-separated",
       value=Text(), metavar="METHODS", default="GET, POST, DELETE, OPTIONS",
       env="LLAMA_ARG_CORS_METHODS", accepts='"GET, POST, DELETE, OPTIONS"'),
    _t(("--cors-headers",), "cors_headers", "headers allowed by CORS, comma-separated",
       value=Text(), metavar="HEADERS", default="*", env="LLAMA_ARG_CORS_HEADERS"),
    _t(("--cors-credentials",), "cors_credentials", "allow credentials in CORS requests",
       kind="bool", negations=("--no-cors-credentials",), default=True,
       env="LLAMA_ARG_CORS_CREDENTIALS"),
    _t(("--api-prefix",), "api_prefix", "path prefix every route is served under",
       value=Text(allow_empty=True), metavar="PREFIX", default="", default_text="",
       env="LLAMA_ARG_API_PREFIX", accepts='""'),
    _t(("--api-key-file",), "api_key_file",
       "read API keys from a file, one per line (# starts a comment)",
       value=Text(), metavar="FNAME", default_text="none", env="LLAMA_ARG_API_KEY_FILE",
       instead="pass the keys with --api-key or LLAMA_API_KEY instead"),
    _t(("--ssl-key-file",), "ssl_key_file", "PEM private key for HTTPS", value=Text(),
       metavar="FNAME", env="LLAMA_ARG_SSL_KEY_FILE",
       instead="terminate TLS in a reverse proxy in front of the server"),
    _t(("--ssl-cert-file",), "ssl_cert_file", "PEM certificate for HTTPS", value=Text(),
       metavar="FNAME", env="LLAMA_ARG_SSL_CERT_FILE",
       instead="terminate TLS in a reverse proxy in front of the server"),
    _t(("--threads-http",), "threads_http", "threads serving HTTP requests",
       value=Int(), metavar="N", default=-1, env="LLAMA_ARG_THREADS_HTTP",
       inert=at_most(0), accepts="0 or less (automatic)"),
)

ENDPOINTS: tuple[Option, ...] = (
    _e(("--metrics",), "metrics", "serve Prometheus metrics at /metrics", kind="flag",
       env="LLAMA_ARG_ENDPOINT_METRICS", default_text="disabled"),
    _e(("--props",), "props", "let POST /props change global properties", kind="flag",
       env="LLAMA_ARG_ENDPOINT_PROPS", default_text="disabled"),
    _e(("--slots",), "slots", "serve the slot monitor at /slots", kind="bool",
       negations=("--no-slots",), default=True, env="LLAMA_ARG_ENDPOINT_SLOTS"),
    _e(("--slot-save-path",), "slot_save_path", "directory where slots are saved",
       value=Text(), metavar="PATH", default_text="disabled"),
    _e(("--sleep-idle-seconds",), "sleep_idle_seconds",
       "unload the model after this many idle seconds", value=Int(),
       metavar="SECONDS", default=-1, default_text="-1; -1 = disabled",
       inert=below(0), accepts="a negative number (disabled)"),
    _e(("--models-dir",), "models_dir", "router mode: directory of models to serve",
       value=Text(), metavar="PATH", default_text="disabled", env="LLAMA_ARG_MODELS_DIR",
       instead="serve one model with --model"),
    _e(("--models-preset",), "models_preset", "router mode: INI file of model presets",
       value=Text(), metavar="PATH", default_text="disabled",
       env="LLAMA_ARG_MODELS_PRESET", instead="serve one model with --model"),
    _e(("--models-max",), "models_max", "router mode: most models loaded at once",
       value=Int(), metavar="N", default=4, default_text="4, 0 = unlimited",
       env="LLAMA_ARG_MODELS_MAX"),
    _e(("--models-autoload",), "models_autoload", "router mode: load models on demand",
       kind="bool", negations=("--no-models-autoload",), default=True,
       env="LLAMA_ARG_MODELS_AUTOLOAD"),
)

"""Server options: logging, transport, CORS and API-key files (acted on:
see logging_setup.py, server/http/listen.py, server/http/cors.py); the
monitoring endpoints and idle sleep (acted on: server/surfaces/info.py,
server/surfaces/metrics.py, engine/loop.py); slot files (acted on:
server/sessions/slot_files.py); the router (deferred: upstream's default, or
the value asking for nothing, is accepted, anything else is refused as not
implemented yet).

--threads-http is not applicable: requests are served by one Trio event
loop, and upstream's fixed pool never bounded concurrency either (it grows
by up to 1024 dynamic threads), so every value is inert.
"""

from __future__ import annotations

from typing import Any

import attrs

from mlxcel_trio.cli.record import Option
from mlxcel_trio.cli.refusals import ALWAYS, deferred, not_applicable
from mlxcel_trio.cli.values import BadValue, Choice, Int, Text

TRANSPORT_ISSUE = 7
ENDPOINTS_ISSUE = 6
ROUTER_ISSUE = 18


def _m(spellings: tuple[str, ...], dest: str, help: str, **kw: Any) -> Option:
    kw.setdefault("section", "server")
    kw.setdefault("owner", ENDPOINTS_ISSUE)
    return Option(spellings, dest, help, **kw)


def _e(spellings: tuple[str, ...], dest: str, help: str, **kw: Any) -> Option:
    kw.setdefault("section", "server")
    return deferred(spellings, dest, help, issue=ENDPOINTS_ISSUE, **kw)


@attrs.frozen
class Directory(Text):
    """An existing directory, made absolute and canonical (symlinks resolved)
    once at startup, as upstream's --slot-save-path checks fs_is_directory."""

    @property
    def domain(self) -> str:
        return "an existing directory"

    def parse(self, text: str) -> str:
        import os

        if not text or not os.path.isdir(text):
            raise BadValue(f"not a directory: {text}")
        return os.path.realpath(text)


@attrs.frozen
class LogColors(Choice):
    """upstream's --log-colors vocabulary, case-sensitive: on/enabled/true/1,
    off/disabled/false/0, auto/-1; folded to "on", "off" or "auto" (the
    `choices` --completion-bash offers)."""

    choices: tuple[str, ...] = ("on", "off", "auto")

    @property
    def domain(self) -> str:
        return "on, off or auto (also enabled/true/1, disabled/false/0, -1)"

    def parse(self, text: str) -> str:
        if text in ("on", "enabled", "true", "1"):
            return "on"
        if text in ("off", "disabled", "false", "0"):
            return "off"
        if text in ("auto", "-1"):
            return "auto"
        raise BadValue(f"unknown value for --log-colors: {text!r}")


LOGGING: tuple[Option, ...] = (
    Option(("--log-disable",), "log_disable",
           "write no log at all (the readiness lines on stdout stay)", kind="flag",
           default=False, status="by_design", owner=TRANSPORT_ISSUE),
    Option(("--log-file",), "log_file",
           "append the log to this file (created 0600; never a symlink or a directory) "
           "instead of stdout; LLAMA_LOG_FILE is read when neither is set",
           value=Text(), metavar="FNAME", env="LLAMA_ARG_LOG_FILE", status="by_design",
           owner=TRANSPORT_ISSUE, router_only=True),
    Option(("--log-colors",), "log_colors",
           "colour the log: on, off, or auto (only when the log goes to a terminal)",
           value=LogColors(), metavar="[on|off|auto]", default="auto",
           env="LLAMA_ARG_LOG_COLORS", owner=TRANSPORT_ISSUE),
    Option(("-lv", "--verbosity", "--log-verbosity"), "log_verbosity",
           "log threshold: 0 generic output, 1 error, 2 warning, 3 info, 4 trace, 5 debug",
           value=Int(), metavar="N", default=3, env="LLAMA_ARG_LOG_VERBOSITY",
           owner=TRANSPORT_ISSUE),
    Option(("--log-prefix",), "log_prefix",
           "start each log line with its level (and the timestamp)", kind="bool",
           negations=("--no-log-prefix",), default=True, env="LLAMA_ARG_LOG_PREFIX",
           owner=TRANSPORT_ISSUE),
    Option(("--log-timestamps",), "log_timestamps",
           "put the time since startup in each line's prefix", kind="bool",
           negations=("--no-log-timestamps",), default=True, env="LLAMA_ARG_LOG_TIMESTAMPS",
           owner=TRANSPORT_ISSUE),
)


def _s(spellings: tuple[str, ...], dest: str, help: str, **kw: Any) -> Option:
    kw.setdefault("section", "server")
    kw.setdefault("owner", TRANSPORT_ISSUE)
    return Option(spellings, dest, help, **kw)


TRANSPORT: tuple[Option, ...] = (
    _s(("--reuse-port",), "reuse_port", "let several sockets bind the same port (SO_REUSEPORT)",
       kind="flag", default=False, env="LLAMA_ARG_REUSE_PORT", default_text="disabled",
       router_only=True),
    _s(("--cors-origins",), "cors_origins",
       "allowed CORS origins, sent as given; * with credentials echoes the request's "
       "Origin, and 'localhost' echoes it only for a localhost origin",
       value=Text(allow_empty=True), metavar="ORIGINS", default="*",
       env="LLAMA_ARG_CORS_ORIGINS"),
    _s(("--cors-methods",), "cors_methods", "methods allowed by CORS, comma-separated",
       value=Text(allow_empty=True), metavar="METHODS", default="GET, POST, DELETE, OPTIONS",
       env="LLAMA_ARG_CORS_METHODS"),
    _s(("--cors-headers",), "cors_headers", "headers allowed by CORS, comma-separated",
       value=Text(allow_empty=True), metavar="HEADERS", default="*",
       env="LLAMA_ARG_CORS_HEADERS"),
    _s(("--cors-credentials",), "cors_credentials", "allow credentials in CORS requests",
       kind="bool", negations=("--no-cors-credentials",), default=True,
       env="LLAMA_ARG_CORS_CREDENTIALS"),
    _s(("--api-prefix",), "api_prefix",
       "path prefix every route is served under, without the trailing slash",
       value=Text(allow_empty=True), metavar="PREFIX", default="", default_text="",
       env="LLAMA_ARG_API_PREFIX"),
    _s(("--api-key-file",), "api_key_file",
       "read API keys from a file, one per line (a line starting with # is a comment)",
       value=Text(), metavar="FNAME", default_text="none", env="LLAMA_ARG_API_KEY_FILE"),
    _s(("--ssl-key-file",), "ssl_key_file", "PEM private key for HTTPS (with --ssl-cert-file)",
       value=Text(), metavar="FNAME", env="LLAMA_ARG_SSL_KEY_FILE", status="by_design",
       router_only=True),
    _s(("--ssl-cert-file",), "ssl_cert_file",
       "PEM certificate for HTTPS (with --ssl-key-file)", value=Text(), metavar="FNAME",
       env="LLAMA_ARG_SSL_CERT_FILE", status="by_design", router_only=True),
    not_applicable(("--threads-http",), "threads_http", "threads serving HTTP requests",
                   value=Int(), metavar="N", default=-1, env="LLAMA_ARG_THREADS_HTTP",
                   why="mlxcel-trio serves HTTP from one Trio event loop with no thread pool",
                   inert=ALWAYS, accepts="any value (there is no pool to size)",
                   section="server", owner=TRANSPORT_ISSUE),
)

ENDPOINTS: tuple[Option, ...] = (
    _m(("--metrics",), "endpoint_metrics", "serve Prometheus metrics at /metrics",
       kind="flag", default=False, env="LLAMA_ARG_ENDPOINT_METRICS", default_text="disabled"),
    _m(("--props",), "endpoint_props", "let POST /props change global properties",
       kind="flag", default=False, env="LLAMA_ARG_ENDPOINT_PROPS", default_text="disabled"),
    _m(("--slots",), "endpoint_slots", "serve the slot monitor at /slots", kind="bool",
       negations=("--no-slots",), default=True, env="LLAMA_ARG_ENDPOINT_SLOTS"),
    Option(("--slot-save-path",), "slot_save_path",
           "directory where POST /slots/{id}?action=save|restore keeps slot files",
           value=Directory(), metavar="PATH", default_text="disabled", section="server",
           owner=ENDPOINTS_ISSUE),
    _m(("--sleep-idle-seconds",), "sleep_idle_seconds",
       "unload the model after this many idle seconds (the next request reloads it)",
       value=Int(), metavar="SECONDS", default=-1, default_text="-1; -1 = disabled"),
    Option(("--models-dir",), "models_dir",
           "router mode (no -m): serve every checkpoint directory under PATH, and the "
           "Hugging Face cache's, each loaded on its first request",
           value=Directory(), metavar="PATH", default_text="disabled",
           env="LLAMA_ARG_MODELS_DIR", section="server", owner=ROUTER_ISSUE, router_only=True),
    Option(("--models-preset",), "models_preset",
           "router mode (no -m): INI file of model presets ([name] sections with "
           "model = PATH or hf-repo = owner/name and options; [*] for every model)",
           value=Text(), metavar="PATH", default_text="disabled",
           env="LLAMA_ARG_MODELS_PRESET", section="server", owner=ROUTER_ISSUE, router_only=True),
    Option(("--models-max",), "models_max",
           "router mode: most models loaded at once (the least recently used is unloaded)",
           value=Int(), metavar="N", default=4, default_text="4, 0 = unlimited",
           env="LLAMA_ARG_MODELS_MAX", section="server", owner=ROUTER_ISSUE, router_only=True),
    Option(("--models-autoload",), "models_autoload",
           "router mode: load a model on its first request (?autoload= per request)",
           kind="bool", negations=("--no-models-autoload",), default=True,
           env="LLAMA_ARG_MODELS_AUTOLOAD", section="server", owner=ROUTER_ISSUE, router_only=True),
)

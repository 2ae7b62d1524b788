"""Files the server must be able to use, checked before the model resolves:
the log destination, API-key files, the TLS key pair; and the secrets every
log sink will redact.

Upstream opens the log file and reads the key file from inside its argument
parser, so a bad path stops it before any model work; so does this module
(``-m owner/name`` may mean a multi-gigabyte download).  Each failure is one
CliError line naming the option, the path, why, and what to do instead.

Log destination precedence: --log-disable, then --log-file (command line,
then LLAMA_ARG_LOG_FILE), then LLAMA_LOG_FILE, then stdout.  The file is
created here (0600), as upstream creates it in its parser.

Secrets: every --api-key / LLAMA_API_KEY item (the environment's even when
the command line overrides it), every key line of --api-key-file and of the
file LLAMA_ARG_API_KEY_FILE names, --hf-token and HF_TOKEN.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

from mlxcel_trio.cli.options import BY_DEST
from mlxcel_trio.cli.parser import CliError, Parsed, describe
from mlxcel_trio.logging_setup import LogFileError, open_log_file
from mlxcel_trio import store_url

LOG_FILE_INSTEAD = "name a regular file in an existing directory, or omit it to log to stdout"


def read_key_file(path: str) -> list[str]:
    """upstream's reading: one key per line, a line that is empty or starts
    with # is skipped, nothing is trimmed but the newline."""
    with open(path, "rb") as f:
        text = f.read().decode("utf-8")
    return [line for line in text.split("\n") if line and not line.startswith("#")]


def _log_file(parsed: Parsed, env: Mapping[str, str]) -> str | None:
    if parsed.values.get("log_disable"):
        return None
    path = parsed.values.get("log_file")
    if path is not None:
        label = describe(BY_DEST["log_file"], parsed)
    elif env.get("LLAMA_LOG_FILE"):
        path = env["LLAMA_LOG_FILE"]
        label = f"--log-file {path!r} (from LLAMA_LOG_FILE)"
    else:
        return None
    try:
        open_log_file(path).close()
    except LogFileError as exc:
        raise CliError(f"{label}: {exc}; {LOG_FILE_INSTEAD}") from None
    return path


def _api_keys(parsed: Parsed) -> list[str]:
    keys = list(parsed.values.get("api_keys") or ())
    path = parsed.values.get("api_key_file")
    if path is None:
        return keys
    try:
        keys += read_key_file(path)
    except OSError as exc:
        raise CliError(f"{describe(BY_DEST['api_key_file'], parsed)}: failed to open file "
                       f"({exc.strerror}); name a readable file of keys, one per line") from None
    except UnicodeDecodeError:
        raise CliError(f"{describe(BY_DEST['api_key_file'], parsed)}: not UTF-8 text; "
                       "write one key per line") from None
    return keys


def _check_tls(parsed: Parsed) -> None:
    key, cert = parsed.values.get("ssl_key_file"), parsed.values.get("ssl_cert_file")
    if key is None and cert is None:
        return
    if key is None or cert is None:
        given, missing = ("ssl_key_file", "--ssl-cert-file") if cert is None else \
            ("ssl_cert_file", "--ssl-key-file")
        raise CliError(f"{describe(BY_DEST[given], parsed)}: HTTPS needs both --ssl-key-file "
                       f"and --ssl-cert-file; give {missing} too, or neither for plain HTTP")
    for dest, path in (("ssl_key_file", key), ("ssl_cert_file", cert)):
        try:
            open(path, "rb").close()
        except OSError as exc:
            raise CliError(f"{describe(BY_DEST[dest], parsed)}: cannot be read "
                           f"({exc.strerror}); name a PEM file") from None
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise CliError(f"--ssl-cert-file {cert!r} with --ssl-key-file {key!r}: the PEM "
                       f"certificate and private key do not load together ({exc}); name a "
                       "matching pair") from None


def secret_values(parsed: Parsed, env: Mapping[str, str], keys: list[str]) -> tuple[str, ...]:
    found = set(keys)
    found.update(k for k in env.get("LLAMA_API_KEY", "").split(",") if k)
    for token in (parsed.values.get("hf_token"), env.get("HF_TOKEN"),
                  store_url.password(parsed.values.get("session_store", ""))):
        if token:
            found.add(token)
    path = env.get("LLAMA_ARG_API_KEY_FILE")
    if path and path != parsed.values.get("api_key_file"):
        try:
            found.update(read_key_file(path))
        except (OSError, UnicodeDecodeError):
            pass  # not the file in use; nothing to register
    return tuple(sorted(found))


def resolve(parsed: Parsed, env: Mapping[str, str]) -> dict[str, Any]:
    """ServerConfig overrides: the resolved log destination, every API key,
    the secrets to redact.  Raises CliError for an unusable file."""
    keys = _api_keys(parsed)
    log_file = _log_file(parsed, env)
    _check_tls(parsed)
    return {"log_file": log_file, "api_keys": tuple(keys),
            "secrets": secret_values(parsed, env, keys)}

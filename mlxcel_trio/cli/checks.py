"""The startup checks that need no model, and the values derived from
several options together: each check raises CliError naming the options it
read; `main._checked` runs them all and reports every problem in one run."""

from __future__ import annotations

import json
import sys
from typing import Any

from mlxcel_trio import blas
from mlxcel_trio.cli import model_ref
from mlxcel_trio.cli.draft_check import lookup_cache_problem, vocab_problem
from mlxcel_trio.cli.options import BY_DEST
from mlxcel_trio.cli.options_chat import check_legacy_template
from mlxcel_trio.cli.options_context import rope_reciprocal_refusal
from mlxcel_trio.cli.parser import CliError, Parsed, describe
from mlxcel_trio.protocol.kv_types import DEFAULT as DEFAULT_KV
from mlxcel_trio.protocol.kv_types import pair_problem
from mlxcel_trio import store_url


def adapters_in_order(parsed: Parsed) -> tuple[tuple[str, float], ...]:
    """--lora and --lora-scaled adapters numbered as upstream numbers them:
    each occurrence's items in command-line order, across both options."""
    values = parsed.values
    if not (values.get("lora") or values.get("lora_scaled")):
        return ()
    taken = {"lora": 0, "lora_scaled": 0}
    out: list[tuple[str, float]] = []
    for dest in parsed.order:
        if dest in taken:
            occurrences = values.get(dest) or ()
            if taken[dest] < len(occurrences):
                out.extend(occurrences[taken[dest]])
            taken[dest] += 1
    if not parsed.order:  # built without the command line's order (tests)
        for dest in taken:
            for items in values.get(dest) or ():
                out.extend(items)
    return tuple(out)


def check_rope(parsed: Parsed) -> None:
    """--rope-scale and --rope-freq-scale given together must agree."""
    values = parsed.values
    reason = rope_reciprocal_refusal(values.get("rope.scale"), values.get("rope.freq_scale"))
    if reason is not None:
        raise CliError(f"{describe(BY_DEST['rope.freq_scale'], parsed)}: {reason}")


def check_chat_template(parsed: Parsed) -> None:
    """With --no-jinja the template must select a built-in format."""
    reason = check_legacy_template(parsed.values)
    if reason is not None:
        dest = "chat_template" if parsed.values.get("chat_template") else "chat_template_file"
        raise CliError(f"{describe(BY_DEST[dest], parsed)}: {reason}")


def check_blas(parsed: Parsed) -> None:
    """--blas names auto, bundled or a library that exists."""
    reason = blas.setting_problem(parsed.values.get("blas", blas.AUTO))
    if reason is not None:
        raise CliError(f"{describe(BY_DEST['blas'], parsed)}: {reason}")


def check_session_store(parsed: Parsed) -> None:
    """--session-store is memory, a usable file:// directory or a redis://
    URL; the password a URL carries never appears in the message."""
    raw = parsed.values.get("session_store", store_url.MEMORY)
    reason = store_url.problem(raw)
    if reason is not None:
        source = parsed.given.get("session_store", "argv")
        origin = "" if source == "argv" else f" (from {source})"
        raise CliError(f"--session-store {store_url.redacted(raw)!r}{origin}: {reason}")
    if raw != store_url.MEMORY and not store_url.is_file(raw):
        try:
            import redis  # noqa: F401  (the `redis` extra)
        except ImportError:
            raise CliError(f"--session-store {store_url.redacted(raw)!r}: a shared store needs "
                           "the redis client (pip install 'mlxcel-trio[redis]'); or use "
                           "memory") from None


def check_kv_types(parsed: Parsed) -> None:
    """-ctk and -ctv must be a pair MLX's attention can read."""
    values = parsed.values
    reason = pair_problem(values.get("cache_type_k", DEFAULT_KV),
                          values.get("cache_type_v", DEFAULT_KV))
    if reason is not None:
        given = [BY_DEST[d] for d in ("cache_type_k", "cache_type_v") if d in parsed.given]
        raise CliError(f"{', '.join(describe(opt, parsed) for opt in given)}: {reason}")


_UI_CONFIG = ("ui_config", "ui_config_file")


def ui_settings(parsed: Parsed) -> dict[str, Any]:
    """The web UI's default settings (--ui-config, --ui-config-file) as the
    JSON text /props reports.  Both set the same thing, as upstream: the
    command line beats the environment, and between two given the same way
    the later on the command line wins (from the environment, the file)."""
    given = [d for d in _UI_CONFIG if d in parsed.given]
    if not given:
        return {}

    def rank(dest: str) -> tuple[int, int]:
        on_argv = parsed.given[dest] == "argv"
        seen = [i for i, d in enumerate(parsed.order) if d == dest]
        return (on_argv, seen[-1] if on_argv and seen else _UI_CONFIG.index(dest))

    dest = max(given, key=rank)
    label = describe(BY_DEST[dest], parsed)
    text = parsed.values[dest]
    if dest == "ui_config_file":
        try:
            with open(text, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise CliError(f"{label}: failed to open file ({exc.strerror}); name a readable "
                           "JSON file of UI settings") from None
        except UnicodeDecodeError:
            raise CliError(f"{label}: not UTF-8 text; write the settings as JSON") from None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        raise CliError(f"{label}: failed to parse UI config ({exc}); give JSON such as "
                       "'{\"temperature\": 0.7}'") from None
    return {"ui_settings": json.dumps(value, ensure_ascii=False)}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def check_speculative(parsed: Parsed) -> None:
    """draft-simple needs a draft model, and a draft model needs
    draft-simple (given alone, -md selects it)."""
    values = parsed.values
    types = values.get("spec_type", ("none",))
    model = values.get("spec_model")
    if "draft-simple" in types and not model:
        raise CliError(f"{describe(BY_DEST['spec_type'], parsed)}: draft-simple needs a draft "
                       "model; add -md <draft checkpoint>")
    if model and "spec_type" in parsed.given and "draft-simple" not in types:
        raise CliError(f"{describe(BY_DEST['spec_model'], parsed)}: only --spec-type "
                       "draft-simple uses a draft model; add draft-simple to --spec-type "
                       "or drop -md")
    for dest in ("spec_lookup_cache_static", "spec_lookup_cache_dynamic"):
        path = values.get(dest)
        if not path:
            continue
        option = describe(BY_DEST[dest], parsed)
        if "ngram-cache" not in types:
            # upstream reads the file only for ngram-cache, and so do we
            print(f"warning: {option} has no effect without --spec-type ngram-cache",
                  file=sys.stderr)
            continue
        problem = lookup_cache_problem(path)
        if problem is not None:
            raise CliError(f"{option}: {problem}; name a lookup cache file written by "
                           "llama.cpp's llama-lookup-create, or drop the option")


def resolve_draft(parsed: Parsed, target: str) -> dict[str, Any]:
    """-md resolved like -m, and checked against the target's vocabulary."""
    ref = parsed.values.get("spec_model")
    if not ref:
        return {}
    option = describe(BY_DEST["spec_model"], parsed)
    try:
        path = model_ref.resolve(ref, token=parsed.values.get("hf_token") or None).path
    except model_ref.ModelRefError as exc:
        raise CliError(f"{option}: {exc}") from None
    problem = vocab_problem(target, path)
    if problem is not None:
        raise CliError(f"{option}: {problem}; use a draft checkpoint built with the "
                       "target's tokenizer")
    out: dict[str, Any] = {"spec_model": path}
    if "spec_type" not in parsed.given:
        out["spec_type"] = ("draft-simple",)
    return out

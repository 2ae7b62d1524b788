"""The sampling fields of a completion request: server defaults, the
fields with upstream custom handlers, and what generation_settings reports.

Precedence is upstream's: a field present in the request wins; absent (or
null), the server's value applies, which comes from the command line, else
(temperature / top_k / top_p only) the checkpoint's generation_config.json,
else upstream's default.  Handlers with semantics beyond the field table:

* dry_base below 1.0 falls back to the server's value;
* dry_sequence_breakers must be a non-empty array of strings;
* samplers: an array of names or a string of letters; other types leave
  the server's chain in place; an order we do not serve is a 400;
* logit_bias: [token, bias] pairs or an object; string tokens are
  tokenized; false bans; malformed entries are skipped; it replaces the
  server's list (-l, and --ignore-eos's bans);
* ignore_eos: true appends a ban for every end-of-generation token.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from ...protocol.records import DEFAULT_DRY_BREAKERS, SamplingParams
from ...protocol import sampler_names as names
from ..http.errors import ApiError, json_type_name

INT32 = 2**32

# fields whose value is a C++ float member upstream (reported float32-rounded)
FLOAT_FIELDS = ("temperature", "dynatemp_range", "dynatemp_exponent", "top_p", "min_p",
                "top_n_sigma", "xtc_probability", "xtc_threshold", "typical_p",
                "repeat_penalty", "presence_penalty", "frequency_penalty", "dry_multiplier",
                "dry_base", "mirostat_tau", "mirostat_eta", "adaptive_target",
                "adaptive_decay")


def f32(x: float) -> float:
    """The value a C++ float member holds, as nlohmann prints it."""
    return float(np.float32(x))


def json_float(x: float) -> float | None:
    """nlohmann writes a non-finite float as null."""
    return x if math.isfinite(x) else None


def process_escapes(text: str) -> str:
    """string_process_escapes: \\n \\r \\t \\' \\" \\\\ and \\xNN, on bytes."""
    src = text.encode("utf-8", "surrogateescape")
    out = bytearray()
    i, n = 0, len(src)
    simple = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("'"): 39, ord('"'): 34, ord("\\"): 92}
    while i < n:
        c = src[i]
        if c == 0x5C and i + 1 < n:
            i += 1
            e = src[i]
            if e in simple:
                out.append(simple[e])
            elif e == ord("x") and i + 2 < n and re.fullmatch(rb"\s*[+-]?[0-9a-fA-F]+",
                                                              src[i + 1:i + 3]):
                out.append(int(src[i + 1:i + 3], 16) & 0xFF)
                i += 2
            else:
                out += bytes((0x5C, e))
        else:
            out.append(c)
        i += 1
    return out.decode("utf-8", "replace")


def _chain(s) -> tuple[str, ...]:
    """The chain in force from --samplers / --sampler-seq (--samplers wins
    when both are given; startup refused every order we do not serve)."""
    if s.samplers != names.DEFAULT_NAMES:
        return names.from_names(s.samplers.split(";"))
    if s.sampler_seq != names.DEFAULT_LETTERS:
        return names.from_letters(s.sampler_seq)
    return names.from_names(s.samplers.split(";"))


def _breakers(given) -> tuple[str, ...]:
    """--dry-sequence-breaker: the first one replaces upstream's set, each
    further one adds, "none" empties the list so far."""
    if given is None:
        return DEFAULT_DRY_BREAKERS
    out: list[str] = []
    for b in given:
        out = [] if b == "none" else [*out, b]
    return tuple(out)


def eog_bias(vocab) -> tuple[tuple[int, float], ...]:
    return tuple((t, -math.inf) for t in sorted(vocab.eos_ids))


def server_defaults(config, vocab) -> dict[str, Any]:
    """Flag given -> flag; else the checkpoint's generation_config.json
    (temperature / top_k / top_p, recorded by_design); else upstream's."""
    s = config.sampling
    gen = vocab.generation_defaults
    pick = lambda flag, key, dflt: flag if flag is not None else gen.get(key, dflt)  # noqa: E731
    esc = process_escapes if s.escape else (lambda t: t)
    breakers = _breakers(s.dry_sequence_breakers)
    bias = tuple(s.logit_bias) + (eog_bias(vocab) if s.ignore_eos else ())
    out = {
        "temperature": max(pick(s.temperature, "temperature", 0.8), 0.0),
        "top_k": int(pick(s.top_k, "top_k", 40)),
        "top_p": pick(s.top_p, "top_p", 0.95),
        "min_p": s.min_p,
        "seed": s.seed,
        "n_predict": s.n_predict,
        "sse_ping_interval": config.sse_ping_interval,
        "top_n_sigma": s.top_n_sigma,
        "xtc_probability": s.xtc_probability,
        "xtc_threshold": s.xtc_threshold,
        "typical_p": s.typical_p,
        "repeat_last_n": s.repeat_last_n,
        "repeat_penalty": s.repeat_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "dry_multiplier": s.dry_multiplier,
        "dry_base": s.dry_base if s.dry_base >= 1.0 else 1.75,
        "dry_allowed_length": s.dry_allowed_length,
        "dry_penalty_last_n": s.dry_penalty_last_n,
        "dry_sequence_breakers": tuple(esc(b) for b in breakers),
        "mirostat": s.mirostat,
        "mirostat_tau": s.mirostat_tau,
        "mirostat_eta": s.mirostat_eta,
        "adaptive_target": s.adaptive_target,
        "adaptive_decay": s.adaptive_decay,
        "dynatemp_range": s.dynatemp_range,
        "dynatemp_exponent": s.dynatemp_exp,
        "samplers": _chain(s),
        "logit_bias": bias,
        "ignore_eos": s.ignore_eos,
        "stop": tuple(t for t in (esc(r) for r in s.reverse_prompt) if t),
    }
    for key in FLOAT_FIELDS:
        out[key] = f32(out[key])
    return out


# -- request fields with custom handlers ------------------------------------------

def _present(body: dict, key: str) -> bool:
    return body.get(key) is not None


def _strings(value, field: str) -> list[str]:
    items = []
    for item in value:
        if not isinstance(item, str):
            raise ApiError(f"Field '{field}': [json.exception.type_error.302] type must be "
                           f"string, but is {json_type_name(item)}")
        items.append(item)
    return items


def _token_id(value: int) -> int:
    """A JSON integer read as int32 (nlohmann wraps)."""
    value %= INT32
    return value - INT32 if value >= 2**31 else value


def _key_id(key: str) -> int | None:
    """strtol(key, &end, 10) consuming the whole key, or None."""
    if key == "":
        return 0
    if not re.fullmatch(r"[ \t\n\v\f\r]*[+-]?[0-9]+", key):
        return None
    value = max(min(int(key), 2**63 - 1), -(2**63))
    return _token_id(value)


def _bias_value(v) -> float | None:
    if isinstance(v, bool):
        return None if v else -math.inf
    if isinstance(v, (int, float)):
        try:
            return f32(float(v))
        except OverflowError:
            return math.inf if v > 0 else -math.inf
    return None


def parse_logit_bias(value, vocab) -> tuple[tuple[int, float], ...]:
    n_vocab = vocab.n_vocab
    out: list[tuple[int, float]] = []

    def text_ids(text: str) -> list[int]:
        return vocab.tokenize(text, add_special=False, parse_special=False)

    if isinstance(value, list):
        for el in value:
            if not isinstance(el, list) or len(el) != 2:
                continue
            bias = _bias_value(el[1])
            if bias is None:
                continue
            tok = el[0]
            if isinstance(tok, int) and not isinstance(tok, bool):
                tok = _token_id(tok)
                if 0 <= tok < n_vocab:
                    out.append((tok, bias))
            elif isinstance(tok, str):
                out.extend((t, bias) for t in text_ids(tok))
    elif isinstance(value, dict):
        for key, v in value.items():
            bias = _bias_value(v)
            if bias is None:
                continue
            tok = _key_id(key)
            if tok is None:
                out.extend((t, bias) for t in text_ids(key))
            elif 0 <= tok < n_vocab:
                out.append((tok, bias))
    return tuple(out)


def resolve(body: dict, values: dict, served) -> None:
    """Apply the custom handlers in upstream's schema order (in place)."""
    defaults = served.defaults
    if _present(body, "dry_base") and values["dry_base"] < 1.0:
        values["dry_base"] = defaults.get("dry_base", f32(1.75))
    if _present(body, "dry_sequence_breakers"):
        raw = body["dry_sequence_breakers"]
        items = raw if isinstance(raw, list) and all(isinstance(i, str) for i in raw) else []
        if not items:
            raise ApiError("Field 'dry_sequence_breakers': Error: dry_sequence_breakers must "
                           "be a non-empty array of strings")
        values["dry_sequence_breakers"] = tuple(items)
    vocab = served.bridge.vocab
    if _present(body, "logit_bias"):
        values["logit_bias"] = parse_logit_bias(body["logit_bias"], vocab)
    if _present(body, "ignore_eos") and values["ignore_eos"]:
        values["logit_bias"] = tuple(values["logit_bias"]) + eog_bias(vocab)
    if _present(body, "samplers"):
        raw = body["samplers"]
        if isinstance(raw, list):
            values["samplers"] = names.from_names(_strings(raw, "samplers"))
        elif isinstance(raw, str):
            values["samplers"] = names.from_letters(raw)
        else:  # upstream leaves its list alone for any other type
            values["samplers"] = defaults.get("samplers", names.from_names(
                names.DEFAULT_NAMES.split(";")))
        why = names.unsupported(tuple(values["samplers"]))
        if why is not None:
            raise ApiError(f"Field 'samplers': {why}")
    values["samplers"] = tuple(values["samplers"])
    values["dry_sequence_breakers"] = tuple(values["dry_sequence_breakers"])


def params(values: dict, seed: int) -> SamplingParams:
    """The engine's record of a resolved request."""
    return SamplingParams(
        temperature=values["temperature"], dynatemp_range=values["dynatemp_range"],
        dynatemp_exponent=values["dynatemp_exponent"], top_k=values["top_k"],
        top_p=values["top_p"], min_p=values["min_p"], top_n_sigma=values["top_n_sigma"],
        xtc_probability=values["xtc_probability"], xtc_threshold=values["xtc_threshold"],
        typical_p=values["typical_p"], repeat_last_n=values["repeat_last_n"],
        repeat_penalty=values["repeat_penalty"], frequency_penalty=values["frequency_penalty"],
        presence_penalty=values["presence_penalty"], dry_multiplier=values["dry_multiplier"],
        dry_base=values["dry_base"], dry_allowed_length=values["dry_allowed_length"],
        dry_penalty_last_n=values["dry_penalty_last_n"],
        dry_sequence_breakers=values["dry_sequence_breakers"], mirostat=values["mirostat"],
        mirostat_tau=values["mirostat_tau"], mirostat_eta=values["mirostat_eta"],
        adaptive_target=values["adaptive_target"], adaptive_decay=values["adaptive_decay"],
        min_keep=values["min_keep"], seed=seed, samplers=values["samplers"],
        logit_bias=values["logit_bias"], n_probs=values["n_probs"],
        post_sampling_probs=values["post_sampling_probs"],
    )


def check(values: dict) -> None:
    """common_sampler_init's checks: a failure refuses the request."""
    rp = values["repeat_penalty"]
    why = None
    with np.errstate(over="ignore", divide="ignore"):
        inverse = np.float32(1.0) / np.float32(rp) if rp > 0 else np.float32(0)
    if not math.isfinite(rp) or rp <= 0.0 or not np.isfinite(inverse):
        why = "penalty_repeat must be finite and greater than 0"
    elif not math.isfinite(values["frequency_penalty"]):
        why = "penalty_freq must be finite"
    elif not math.isfinite(values["presence_penalty"]):
        why = "penalty_present must be finite"
    if why is not None:
        raise ApiError(f"Failed to initialize samplers: {why}")


def settings(values: dict) -> dict[str, Any]:
    """The sampling part of generation_settings, in task_params::to_json order
    up to adaptive_decay."""
    fl = lambda k: json_float(values[k])  # noqa: E731
    return {
        "seed": values["seed"],
        "temperature": fl("temperature"),
        "dynatemp_range": fl("dynatemp_range"),
        "dynatemp_exponent": fl("dynatemp_exponent"),
        "top_k": values["top_k"],
        "top_p": fl("top_p"),
        "min_p": fl("min_p"),
        "top_n_sigma": fl("top_n_sigma"),
        "xtc_probability": fl("xtc_probability"),
        "xtc_threshold": fl("xtc_threshold"),
        "typical_p": fl("typical_p"),
        "repeat_last_n": values["repeat_last_n"],
        "repeat_penalty": fl("repeat_penalty"),
        "presence_penalty": fl("presence_penalty"),
        "frequency_penalty": fl("frequency_penalty"),
        "dry_multiplier": fl("dry_multiplier"),
        "dry_base": fl("dry_base"),
        "dry_allowed_length": values["dry_allowed_length"],
        "dry_penalty_last_n": values["dry_penalty_last_n"],
        "dry_sequence_breakers": list(values["dry_sequence_breakers"]),
        "mirostat": values["mirostat"],
        "mirostat_tau": fl("mirostat_tau"),
        "mirostat_eta": fl("mirostat_eta"),
        "adaptive_target": fl("adaptive_target"),
        "adaptive_decay": fl("adaptive_decay"),
    }


def logit_bias_json(values: dict) -> list[dict]:
    return [{"bias": json_float(b), "token": t} for t, b in values["logit_bias"]]

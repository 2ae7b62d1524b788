"""The sampling fields of a completion request: server defaults, the
fields with upstream custom handlers, and the engine's record of them.

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

`resolve` returns a new record (attrs.evolve); nothing is changed in place.
`params` builds the engine's `SamplingParams` by name: each of its
attributes is a NATIVE_FIELDS row (a test holds them in step).
"""

from __future__ import annotations

import math
import re
from typing import Any

import attrs
import numpy as np

from ...protocol.records import DEFAULT_DRY_BREAKERS, SamplingParams
from ...protocol import sampler_names as names
from ..http.errors import ApiError, type_error
from ...protocol.fields import NATIVE_FIELDS, default
from .schema import NativeRequest

INT32 = 2**32

# fields whose value is a C++ float member upstream (reported float32-rounded)
FLOAT_FIELDS = tuple(f.name for f in NATIVE_FIELDS if f.kind == "float")
# SamplingDefaults attributes that are their same-named field's server
# default as given (the rest are read by hand below)
_PLAIN = ("min_p", "seed", "n_predict", "top_n_sigma", "xtc_probability", "xtc_threshold",
          "typical_p", "repeat_last_n", "repeat_penalty", "presence_penalty",
          "frequency_penalty", "dry_multiplier", "dry_allowed_length", "dry_penalty_last_n",
          "mirostat", "mirostat_tau", "mirostat_eta", "adaptive_target", "adaptive_decay",
          "dynatemp_range", "ignore_eos")


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
    """The sampling fields' server values: flag given -> flag; else (temperature
    / top_k / top_p) the checkpoint's generation_config.json (recorded
    by_design); else the table's default."""
    s = config.sampling
    gen = vocab.generation_defaults

    def pick(name: str) -> Any:
        flag = getattr(s, name)
        return flag if flag is not None else gen.get(name, default(name))

    esc = process_escapes if s.escape else (lambda t: t)
    out = {name: getattr(s, name) for name in _PLAIN}
    out.update(
        temperature=max(pick("temperature"), 0.0),
        top_k=int(pick("top_k")),
        top_p=pick("top_p"),
        sse_ping_interval=config.sse_ping_interval,
        dry_base=s.dry_base if s.dry_base >= 1.0 else default("dry_base"),
        dry_sequence_breakers=tuple(esc(b) for b in _breakers(s.dry_sequence_breakers)),
        dynatemp_exponent=s.dynatemp_exp,
        samplers=_chain(s),
        logit_bias=tuple(s.logit_bias) + (eog_bias(vocab) if s.ignore_eos else ()),
        stop=tuple(t for t in (esc(r) for r in s.reverse_prompt) if t),
    )
    for key in FLOAT_FIELDS:
        if key in out:
            out[key] = f32(out[key])
    return out


# -- request fields with custom handlers ------------------------------------------

def _present(body: dict, key: str) -> bool:
    return body.get(key) is not None


def _strings(value, field: str) -> list[str]:
    items = []
    for item in value:
        if not isinstance(item, str):
            raise type_error("string", item, field)
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


def resolve(body: dict, rec: NativeRequest, served) -> NativeRequest:
    """Apply the custom handlers in upstream's schema order: a new record."""
    base = served.defaults
    new: dict[str, Any] = {}
    if _present(body, "dry_base") and rec.dry_base < 1.0:
        new["dry_base"] = base.dry_base
    if _present(body, "dry_sequence_breakers"):
        raw = body["dry_sequence_breakers"]
        items = raw if isinstance(raw, list) and all(isinstance(i, str) for i in raw) else []
        if not items:
            raise ApiError("Field 'dry_sequence_breakers': Error: dry_sequence_breakers must "
                           "be a non-empty array of strings")
        new["dry_sequence_breakers"] = tuple(items)
    vocab = served.bridge.vocab
    bias = rec.logit_bias
    if _present(body, "logit_bias"):
        bias = new["logit_bias"] = parse_logit_bias(body["logit_bias"], vocab)
    if _present(body, "ignore_eos") and rec.ignore_eos:
        new["logit_bias"] = tuple(bias) + eog_bias(vocab)
    if _present(body, "samplers"):
        raw = body["samplers"]
        if isinstance(raw, list):
            chain = names.from_names(_strings(raw, "samplers"))
        elif isinstance(raw, str):
            chain = names.from_letters(raw)
        else:  # upstream leaves its list alone for any other type
            chain = base.samplers
        why = names.unsupported(tuple(chain))
        if why is not None:
            raise ApiError(f"Field 'samplers': {why}")
        new["samplers"] = tuple(chain)
    return attrs.evolve(rec, **new)


def params(rec: NativeRequest, seed: int) -> SamplingParams:
    """The engine's record of a resolved request: each SamplingParams
    attribute is the same-named field's value (`seed`: the copy's)."""
    values = {a.name: getattr(rec, a.name) for a in attrs.fields(SamplingParams)}
    return SamplingParams(**{**values, "seed": seed})


def check(rec: NativeRequest) -> None:
    """common_sampler_init's checks: a failure refuses the request."""
    rp = rec.repeat_penalty
    why = None
    with np.errstate(over="ignore", divide="ignore"):
        inverse = np.float32(1.0) / np.float32(rp) if rp > 0 else np.float32(0)
    if not math.isfinite(rp) or rp <= 0.0 or not np.isfinite(inverse):
        why = "penalty_repeat must be finite and greater than 0"
    elif not math.isfinite(rec.frequency_penalty):
        why = "penalty_freq must be finite"
    elif not math.isfinite(rec.presence_penalty):
        why = "penalty_present must be finite"
    if why is not None:
        raise ApiError(f"Failed to initialize samplers: {why}")

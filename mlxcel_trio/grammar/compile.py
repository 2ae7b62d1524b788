"""From a request's grammar or JSON schema to a ready llguidance matcher.

`Compiler` belongs to one vocabulary: it builds llguidance's tokenizer once
(the expensive part, ~1 s for a large vocabulary) and keeps the most recent
compiled grammars, so a deployment that sends the same schema with every
request compiles it once.  Compiling (GBNF parse + lowering, or llguidance's
JSON-schema front end, then the matcher's construction) can take from
milliseconds to a second for large grammars: callers run it off the Trio
thread (server/request/grammar_fields.py uses trio.to_thread).  A `CompiledGrammar` is
immutable; each sequence gets its own matcher copy through `start`.

Limits: GBNF source above 256 KiB is refused (upstream has none, a recorded
divergence), and so is a lowered grammar above 4 MiB.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Callable

import attrs
import llguidance as llg

from .constraint import Constraint, Triggers
from .gbnf import GbnfError, parse
from .lark import to_lark

MAX_GBNF_BYTES = 256 * 1024
MAX_LOWERED_BYTES = 4 * 1024 * 1024
CACHE_SIZE = 32
# upstream's JSON-schema grammars allow " " or up to two newlines and 20
# spaces/tabs wherever JSON allows whitespace, never before or after the value
JSON_WHITESPACE = r"[ ]|\n{1,2}[ \t]{0,20}"


class GrammarError(ValueError):
    """A grammar or schema that cannot constrain generation; str() is the
    reason, for a 400 or a startup line."""


@attrs.frozen
class GrammarSpec:
    kind: str                     # "gbnf" | "json_schema" | "lark" (built in-house only)
    text: str                     # GBNF source, the schema as JSON text, or llguidance lark
    lazy: bool = False
    triggers: Triggers = Triggers()


@attrs.frozen(eq=False)
class CompiledGrammar:
    spec: GrammarSpec
    lark: str                      # what llguidance was given (diagnostics)
    _proto: object                 # an unused llguidance.LLMatcher
    _piece: Callable[[int], bytes]
    _tokenize: Callable[[str], list[int]]
    n_vocab: int
    eos_ids: tuple[int, ...]

    def matcher(self) -> llg.LLMatcher:
        """A fresh llguidance matcher at the grammar's start (the compiled one
        is shared through the cache and never advanced)."""
        return self._proto.deep_copy()

    def start(self, n_prompt: int) -> Constraint:
        """A fresh constraint for one sequence whose prompt is n_prompt long."""
        return Constraint(self.matcher(), self.n_vocab, n_prompt, self.spec.lazy,
                          self.spec.triggers, self._piece, self._tokenize, self.eos_ids)


def gbnf_source_check(text: str) -> None:
    size = len(text.encode("utf-8"))
    if size > MAX_GBNF_BYTES:
        raise GrammarError(f"grammar is {size} bytes, over mlxcel-trio's limit of "
                           f"{MAX_GBNF_BYTES} bytes (256 KiB)")


# schema keywords whose values are data, not subschemas
_DATA_KEYS = frozenset({"const", "enum", "default", "examples", "required"})
# keywords mapping names (which may be any word, "const" too) to subschemas
_NAMED = frozenset({"properties", "patternProperties", "$defs", "definitions"})


def upstream_schema(schema):
    """A JSON schema as upstream's converter reads it, for llguidance.
    Arrays: an `items` that is a list (draft 4) is a tuple of exactly those
    items (the `prefixItems` of later drafts, which llguidance knows), and a
    schema with items and no type is an array (JSON Schema itself would
    admit any other value).  Objects: one that lists `properties` and says
    nothing of `additionalProperties` takes no other key (upstream's
    default, where JSON Schema's would let the model write any key)."""
    if isinstance(schema, list):
        return [upstream_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k in _DATA_KEYS else
               {n: upstream_schema(sub) for n, sub in v.items()}
               if k in _NAMED and isinstance(v, dict) else upstream_schema(v))
           for k, v in schema.items()}
    if "properties" in out and out.get("type", "object") == "object" \
            and "additionalProperties" not in out:
        out["additionalProperties"] = False
    items = out.get("items")
    if isinstance(items, list) and "prefixItems" not in out:
        out.update(prefixItems=items, items=False, minItems=len(items))
    if ("items" in out or "prefixItems" in out) and "type" not in out:
        out["type"] = "array"  # upstream: items without a type is an array
    return out


def schema_grammar(schema_text: str) -> str:
    """llguidance's grammar for a JSON schema (no tokenizer needed), with
    upstream's whitespace rule unless the schema sets its own.  An empty
    schema is a JSON object, as upstream's converter reads `{}` (what
    response_format json_object without a schema sends); `true` is any
    value."""
    try:
        schema = json.loads(schema_text)
    except ValueError as exc:
        raise GrammarError(str(exc)) from None
    if not isinstance(schema, (dict, bool)):
        raise GrammarError("a JSON schema must be an object or a boolean")
    if schema == {}:
        schema = {"type": "object"}
    elif schema is True:
        schema = {}
    elif schema is False:
        schema = {"not": {}}
    else:
        schema = upstream_schema(schema)
    try:
        grammar = llg.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_pattern": JSON_WHITESPACE})
    except (ValueError, TypeError) as exc:
        raise GrammarError(str(exc)) from None
    err = llg.LLMatcher.validate_grammar(grammar)
    if err:
        raise GrammarError(err)
    return grammar


class Compiler:
    """One per vocabulary (thread-safe; see the module docstring)."""

    def __init__(self, tokenizer_json: str, n_vocab: int, eos_ids, piece: Callable[[int], bytes],
                 tokenize_special: Callable[[str], list[int]]) -> None:
        self.eos_ids = tuple(sorted(eos_ids))
        self.tokenizer = llg.LLTokenizer(tokenizer_json, n_vocab=n_vocab,
                                         eos_token=list(self.eos_ids) or None)
        self.n_vocab = n_vocab
        self._piece = piece
        self._tokenize_special = tokenize_special
        self._cache: OrderedDict[tuple, tuple[str, object]] = OrderedDict()
        self._lock = threading.Lock()

    def _retokenize(self, text: str) -> list[int]:
        return self.tokenizer.tokenize_str(text, parse_special=False)

    def lower(self, spec: GrammarSpec) -> str:
        if spec.kind == "json_schema":
            return schema_grammar(spec.text)
        if spec.kind == "lark":  # never from a request: the chat routes' tool-call grammar
            return llg.LLMatcher.grammar_from_lark(spec.text)
        gbnf_source_check(spec.text)
        try:
            lark = to_lark(parse(spec.text, self._tokenize_special))
        except GbnfError as exc:
            raise GrammarError(f"failed to parse grammar: {exc}") from None
        if len(lark) > MAX_LOWERED_BYTES:
            raise GrammarError(f"the grammar expands to {len(lark)} bytes, over mlxcel-trio's "
                               f"limit of {MAX_LOWERED_BYTES} bytes (4 MiB)")
        return llg.LLMatcher.grammar_from_lark(lark)

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        key = (spec.kind, spec.text)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
        if hit is None:
            grammar = self.lower(spec)
            proto = llg.LLMatcher(self.tokenizer, grammar, log_level=0)
            if proto.is_error():
                raise GrammarError(proto.get_error())
            hit = (grammar, proto)
            with self._lock:
                self._cache[key] = hit
                while len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
        grammar, proto = hit
        return CompiledGrammar(spec, grammar, proto, self._piece, self._retokenize,
                               self.n_vocab, self.eos_ids)

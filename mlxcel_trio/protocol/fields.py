"""The native completion request schema: ONE table, every upstream field.

Each `Field` states its JSON name, aliases (tried in order after the name),
value kind, default, limits (hard = reject, soft = clamp) and our status.
Everything else is generated from this table:

* `server/request/schema.py`: the frozen request record (`NativeRequest`,
  one attribute per row) and the cattrs converter that structures a body
  into it with upstream's evaluation rules (null = absent, the first
  present spelling wins, numbers converted as the C++ member would be,
  "Field '<spelling>': <message>" on failure, a 400);
* `server/request/settings.py`: `generation_settings` (/completion,
  /props, /slots);
* the engine's `SamplingParams` (every one of its attributes is a row
  here, read off the record by name: `sampler_fields.params`);
* the server-wide defaults: `config.SamplingDefaults` and the CLI's
  sampling options read each default (and --help's text for it) from the
  row, so e.g. top_k's 40 is written once, below.

A new field is one row here plus its behaviour: the code that acts on it
reads `record.<name>` (a dotted name reads with "_", `speculative_n_max`).
A row whose value needs more than the kind's conversion gets a custom
handler after structuring (sampler_fields.resolve, grammar_fields.resolve),
which returns a new record with `attrs.evolve`.

Status "supported" fields are acted on.  "deferred" fields are type-checked
and then ignored until the owning issue implements them (the compatibility
manifest records which).  "inert" fields are accepted and do nothing, on
purpose (upstream ignores them too, e.g. `verbose` on the native route).
`schema=False` marks a field upstream reads outside its schema table
(`id_slot`, read in server-context.cpp): the manifest's field claims skip
it, parsing does not.

This module is pure data (attrs only): config.py and cli/ import it.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import attrs

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
FLOAT_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]  # FLT_MAX


@attrs.frozen
class Field:
    name: str
    kind: str                       # see schema.KINDS: bool | int32 | int64 | uint32 | float
                                    # | json | str | nested | stop | slot
    default: Any = None
    aliases: tuple[str, ...] = ()
    limits: tuple[float, float] | None = None
    hard: bool = False
    status: str = "supported"
    parent: str | None = None       # for subfields of a nested field
    doc: str = ""
    schema: bool = True             # False: upstream reads it outside its schema table

    @property
    def attr(self) -> str:
        """The record attribute holding the field's value."""
        return self.name.replace(".", "_")


def F(name, kind, default=None, *, aliases=(), lim=None, hard=False, status="supported",
      parent=None, doc="", schema=True) -> Field:
    return Field(name, kind, default, tuple(aliases), lim, hard, status, parent, doc, schema)


D = "deferred"
I32 = (0, INT32_MAX)

NATIVE_FIELDS: tuple[Field, ...] = (
    F("verbose", "bool", False, status="inert", doc="native route: no effect upstream either"),
    F("timings_per_token", "bool", False, doc="timings on every streamed frame"),
    F("stream", "bool", False, doc="stream partial results as SSE"),
    F("stream_options", "nested", None, status="inert", doc="type-checked; inert on the native route"),
    F("include_usage", "bool", False, parent="stream_options", status="inert"),
    F("cache_prompt", "bool", True,
      doc="false: no prompt-cache lookup and no donate-back for this request"),
    F("return_tokens", "bool", False, doc="fill `tokens` with the sampled ids"),
    F("return_progress", "bool", False, doc="prompt_progress frames when streaming"),
    F("sse_ping_interval", "int32", 30, lim=(-1, INT32_MAX), hard=True, doc="SSE ping period"),
    F("n_predict", "int32", -1, aliases=("max_completion_tokens", "max_tokens"),
      lim=(-1, INT32_MAX), hard=True, doc="tokens to predict; -1 = until the context bound"),
    F("n_indent", "int32", 0, lim=I32, hard=True, doc="minimum line indentation"),
    F("n_keep", "int32", 0, lim=(-1, INT32_MAX), hard=True,
      doc="context shift: prompt tokens kept (-1 = all); default --keep"),
    F("n_discard", "int32", 0, lim=I32, hard=True,
      doc="context shift: tokens dropped per shift (0 = half)"),
    F("n_cmpl", "int32", 1, aliases=("n",), lim=(1, 1), hard=True,
      doc="completions per prompt; the upper limit is the slot count (set per server)"),
    F("n_cache_reuse", "int32", 0, lim=I32, hard=True,
      doc="smallest cached chunk reused after the prefix by shifting its KV; default --cache-reuse"),
    F("t_max_predict_ms", "int64", -1, lim=(-1, INT64_MAX), hard=True, doc="prediction time bound"),
    F("response_fields", "json", None, doc="project the final response"),
    F("top_k", "int32", 40, lim=I32, doc="top-k"),
    F("top_p", "float", 0.95, lim=(0.0, 1.0), doc="top-p"),
    F("min_p", "float", 0.05, lim=(0.0, 1.0), doc="min-p"),
    F("top_n_sigma", "float", -1.0),
    F("xtc_probability", "float", 0.0, lim=(0.0, 1.0)),
    F("xtc_threshold", "float", 0.1, lim=(0.0, 1.0)),
    F("typical_p", "float", 1.0),
    F("temperature", "float", 0.8, lim=(0.0, math.inf), doc="temperature; <= 0 is greedy"),
    F("dynatemp_range", "float", 0.0),
    F("dynatemp_exponent", "float", 1.0),
    F("repeat_last_n", "int32", 64, lim=I32, hard=True),
    F("repeat_penalty", "float", 1.0),
    F("frequency_penalty", "float", 0.0),
    F("presence_penalty", "float", 0.0),
    F("dry_multiplier", "float", 0.0),
    F("dry_base", "float", 1.75),
    F("dry_allowed_length", "int32", 2, lim=I32, hard=True),
    F("dry_penalty_last_n", "int32", 64, lim=I32, hard=True),
    F("mirostat", "int32", 0, lim=(0, 2)),
    F("mirostat_tau", "float", 5.0),
    F("mirostat_eta", "float", 0.1),
    F("adaptive_target", "float", -1.0, lim=(-FLOAT_MAX, 1.0)),
    F("adaptive_decay", "float", 0.9, lim=(0.0, 0.99), hard=True),
    F("seed", "uint32", 0xFFFF_FFFF, doc="RNG seed; -1 = random"),
    F("n_probs", "int32", 0, aliases=("logprobs",)),
    F("min_keep", "int32", 0, lim=I32, hard=True),
    F("backend_sampling", "bool", False, status="inert",
      doc="MLX samples in the model's own graph; there is no other path to choose"),
    F("post_sampling_probs", "bool", False),
    # compiled out upstream (#if 0): accepted and ignored there too
    *(F(f"speculative.{n}", "json", None, status="inert")
      for n in ("n_max", "n_min", "p_min", "type", "ngram_size_n", "ngram_size_m", "ngram_min_hits")),
    F("lora", "json", None, doc="LoRA scales by adapter id; unlisted adapters get 0"),
    F("dry_sequence_breakers", "json", None),
    F("json_schema", "json", None, aliases=("grammar",), doc="JSON schema, or GBNF as grammar"),
    F("grammar_lazy", "bool", False, doc="constrain only once a trigger fired"),
    F("chat_format", "json", None, status=D),
    F("reasoning_format", "str", None, status=D),
    F("generation_prompt", "str", None, status=D),
    F("parse_tool_calls", "bool", True, status=D),
    F("chat_parser", "str", None, status=D),
    F("continue_final_message", "json", None, status=D),
    F("echo", "bool", False, status="inert",
      doc="inert on the raw routes, as upstream (it only shapes a chat continuation)"),
    F("preserved_tokens", "json", None, doc="token texts word triggers may name"),
    F("grammar_triggers", "json", None, doc="what starts a lazy grammar"),
    F("reasoning_control", "bool", False, doc="arm POST /v1/chat/completions/control"),
    F("reasoning_budget_tokens", "int32", -1, lim=(-1, INT32_MAX), hard=True,
      doc="thinking tokens before a forced close (server/request/budget_fields.py)"),
    F("reasoning_budget_start_tag", "str", None, doc="where counting starts"),
    F("reasoning_budget_end_tags", "json", None, aliases=("reasoning_budget_end_tag",),
      doc="what closes the block; the first is forced"),
    F("reasoning_budget_message", "str", None, doc="forced before the end tag"),
    F("logit_bias", "json", None),
    F("ignore_eos", "bool", False, doc="never stop on an end-of-generation token"),
    F("stop", "stop", (), doc="stop strings"),
    F("samplers", "json", None),
    # upstream: json_value(data, "id_slot", -1) in server-context.cpp
    F("id_slot", "slot", -1, schema=False, doc="the slot to run in; -1 = any free slot"),
)

FIELDS_BY_NAME = {f.name: f for f in NATIVE_FIELDS}


def default(name: str) -> Any:
    """A field's table default (config.py and cli/ read theirs here)."""
    return FIELDS_BY_NAME[name].default



"""Chat templates: Jinja2 in a sandbox, with the context transformers builds.

The prompt a chat request is prefilled with is what the checkpoint's own
template renders, exactly as `transformers`' `apply_chat_template` (and so
mlx-lm) renders it:

* an `ImmutableSandboxedEnvironment` with `trim_blocks` and `lstrip_blocks`
  on, the loop-controls extension, a `{% generation %}` block that renders
  its body, a `tojson` filter that does not HTML-escape (and takes indent /
  separators / sort_keys), and the globals `raise_exception`,
  `strftime_now`, `dict` and a `namespace` that refuses underscore names;
* the context: `messages` (keys whose value is null dropped, reasoning
  aliased as `reasoning_content` and `thinking`), `add_generation_prompt`,
  `documents` (none), the tokenizer's named special tokens (`bos_token`,
  `eos_token`, ...), then the chat-template kwargs.

One deliberate difference from transformers, upstream's rule: `tools` is
absent from the context unless the request carries at least one tool
(transformers passes none).  The two render identically for every guard
shape published templates use, except `tools is defined` alone, where
llama-server's reading (undefined) is the one its clients expect.

A template that raises (`raise_exception`, a type error) surfaces as
`TemplateError` with the template's message.  One deliberate difference
from transformers, upstream's engine: `"text" + undefined` (or null) is
"text", where Jinja2 raises.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

# What llama-server renders with when the checkpoint carries no template.
CHATML = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)

# The context names a chat-template kwarg may not replace.
RESERVED = frozenset(("messages", "tools", "documents", "add_generation_prompt"))
# transformers' SPECIAL_TOKENS_ATTRIBUTES: the named tokens a template sees.
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class TemplateError(Exception):
    """The template failed to compile or to render."""


# -- the environment ---------------------------------------------------------------

class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (assistant-mask markers):
    rendered as their body; nothing here tracks token spans."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _Dict:
    """`dict(...)` for templates, without the type itself."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore-prefixed attribute names."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        values = dict(*args, **kwargs)
        for name in values:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, values)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace: "
                f"{name!r}")


def _absent(value: Any) -> bool:
    return value is None or isinstance(value, jinja2.Undefined)


class _Environment(ImmutableSandboxedEnvironment):
    """The sandbox, with llama-server's one lenient operator: a string `+` an
    undefined or null value is the string (Fireworks' FireFunction v2 template
    adds a `functions` it never defines).  Every other use of an undefined
    value fails as in transformers."""

    intercepted_binops = frozenset(["+"])

    def call_binop(self, context, operator, left, right):
        if operator == "+" and ((isinstance(left, str) and _absent(right))
                                or (_absent(left) and isinstance(right, str))):
            return left if isinstance(left, str) else right
        return super().call_binop(context, operator, left, right)


def _environment() -> ImmutableSandboxedEnvironment:
    env = _Environment(trim_blocks=True, lstrip_blocks=True,
                       extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _Dict()
    env.globals["namespace"] = _Namespace
    return env


_ENV = _environment()


def compile_template(source: str) -> jinja2.Template:
    try:
        return _ENV.from_string(source)
    except jinja2.TemplateError as exc:
        raise TemplateError(f"chat template does not compile: {exc}") from None


# -- the context ---------------------------------------------------------------------

def _plain(value: Any) -> Any:
    """Only JSON types reach the sandbox (request bodies are JSON already)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def normalize_messages(messages: Sequence[Mapping]) -> list[dict]:
    """transformers' normalisation: drop keys whose value is null, then fill
    `reasoning_content` and `thinking` from whichever reasoning name is set."""
    out = []
    for message in messages:
        msg = {k: _plain(v) for k, v in message.items() if v is not None}
        reasoning = next((msg[k] for k in _REASONING_FIELDS if msg.get(k) is not None), None)
        if reasoning is not None:
            msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
        out.append(msg)
    return out


class ChatTemplate:
    """One compiled template plus the tokenizer's named special tokens."""

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None,
                 tool_use_source: str | None = None) -> None:
        self.source = source
        self.tool_use_source = tool_use_source
        self._template = compile_template(source)
        self._tool_use = compile_template(tool_use_source) if tool_use_source else None
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items()
                               if k in SPECIAL_TOKEN_NAMES and v is not None}

    def render(self, messages: Sequence[Mapping], *, tools: Sequence[Mapping] | None = None,
               add_generation_prompt: bool = False,
               kwargs: Mapping[str, Any] | None = None) -> str:
        context: dict[str, Any] = dict(self.special_tokens)
        for key, value in (kwargs or {}).items():
            if key not in RESERVED:
                context[key] = _plain(value)
        context["messages"] = normalize_messages(messages)
        context["documents"] = None
        context["add_generation_prompt"] = add_generation_prompt
        template = self._template
        if tools:
            context["tools"] = _plain(list(tools))
            template = self._tool_use or template
        try:
            return template.render(**context)
        except jinja2.TemplateError as exc:
            raise TemplateError(str(exc)) from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError,
                ZeroDivisionError, RecursionError) as exc:
            raise TemplateError(f"{type(exc).__name__}: {exc}") from None

"""The server-wide chat settings, resolved once from `ServerConfig` and the
checkpoint's tokenizer files.

* The template: --chat-template text, else --chat-template-file, else the
  checkpoint's (chat_template.jinja, then tokenizer_config.json), else
  llama-server's ChatML fallback.  When both flags are given the inline
  text wins, and that is logged.
* The template kwargs: --chat-template-kwargs, then the dedicated flags
  (--reasoning -> enable_thinking, --reasoning-effort -> reasoning_effort,
  --reasoning-preserve -> preserve_reasoning) written into the same map as
  upstream does; where a dedicated flag and the kwargs name the same key
  the flag wins and the collision is logged.  With --reasoning auto (the
  default) and no enable_thinking in --chat-template-kwargs, a Jinja
  template always gets one, as upstream renders every template: true when
  the template supports thinking (it spells a thinking marker, or
  enable_thinking changes what it renders), false otherwise.  A template
  that reads `not enable_thinking` (DeepSeek R1, QwQ) so keeps its thinking
  block open by default instead of closing it.  A request's
  chat_template_kwargs override this map key by key.
* What the output looks like: the tool-call dialect the template teaches
  (chat/dialects: one per model family, detected from markers in the
  template source) and the thinking markers (the dialect's own, else the
  first pair the template spells).
* The path: Jinja, or llama-server's legacy one (chat/legacy.py).  The
  legacy path is in force with --no-jinja (the format detected from the
  template text, as upstream), and with --jinja when --chat-template names a
  built-in format other than chatml: upstream would render such a name as
  a one-word Jinja template, answering every chat with that word, so the
  name is read as the format it names (a recorded divergence).  "chatml"
  is upstream's ChatML Jinja template on either path, as upstream swaps it
  in.  On the legacy path the output is content only (no reasoning or tool
  parsing), as upstream's pure-content parser.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import attrs

from . import dialects, legacy
from .dialects.base import think_of
from .parser import THINK_MARKERS
from .template import CHATML, ChatTemplate

log = logging.getLogger("mlxcel.chat")


@attrs.frozen
class ChatSettings:
    template: ChatTemplate
    kwargs: dict[str, Any]            # server-wide template kwargs
    reasoning_format: str = "auto"
    prefill_assistant: bool = True
    skip_parsing: bool = False
    think_start: str = "<think>"      # "" when the template has no thinking block
    think_end: str = "</think>"
    tool_format: Any = None           # the template's dialect (name, or derived); None: none
    typed_content: bool = True        # the template renders [{"type": "text"}] parts
    caps: dict[str, bool] = attrs.field(factory=dict)  # /props chat_template_caps
    thinks: bool = False              # the template spells the thinking opener
    reasoning_budget: int = -1        # --reasoning-budget (-1: none)
    budget_message: str = ""          # --reasoning-budget-message
    reasoning_alias: str | None = "reasoning"  # --reasoning-alias-field (None: none)
    jinja: bool = True                # False: the legacy path formats the prompt
    legacy: str | None = None         # its format; None there: no format fits the template
    named: bool = False               # the legacy path came from a built-in name under --jinja


def think_markers(source: str) -> tuple[str, str]:
    for start, end in THINK_MARKERS:
        if start in source:
            return start, end
    return THINK_MARKERS[0]


def tool_format(source: str):
    """The tool-call dialect a template teaches its model (chat/dialects):
    a table dialect's name, a dialect derived from the template's own
    rendering of a call (the generic one), or None where it teaches none."""
    dialect = dialects.detect(source)
    if dialect.name == "none":
        return None
    table = dialects.BY_NAME.get(dialect.name)
    # the table's dialect by name, unless detection made a variant beyond the
    # template's thinking markers (think_pair reads those)
    same = table is not None and attrs.evolve(dialect, think=table.think) == table
    return dialect.name if same else dialect


def think_pair(source: str, fmt) -> tuple[str, str]:
    """The thinking markers this template gives its dialect (none where it
    spells none, as upstream); without a dialect, the first pair the
    template spells."""
    if fmt is None:
        return think_markers(source)
    return think_of(dialects.lookup(fmt), source)


_PROBE = "mlxcel-typed-content-probe"


def renders_typed_content(template: ChatTemplate) -> bool:
    """Whether a content-parts list reaches the output (upstream's caps
    probe); a template that only reads string content would drop it, so such
    a template is given the parts' text joined by newlines instead."""
    try:
        out = template.render([{"role": "user", "content": [{"type": "text", "text": _PROBE}]}],
                              add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template that cannot render parts does not take them
        return False
    return _PROBE in out


def template_kwargs(config) -> dict[str, Any]:
    kwargs: dict[str, Any] = json.loads(config.chat_template_kwargs or "{}")
    dedicated: dict[str, Any] = {}
    if config.chat_reasoning in ("on", "off"):
        dedicated["enable_thinking"] = config.chat_reasoning == "on"
    if config.chat_reasoning_effort != "default":
        dedicated["reasoning_effort"] = config.chat_reasoning_effort
    if config.chat_reasoning_preserve is not None:
        dedicated["preserve_reasoning"] = config.chat_reasoning_preserve
    for key, value in dedicated.items():
        if key in kwargs and kwargs[key] != value:
            log.warning("--chat-template-kwargs sets %s=%s; the dedicated flag's %s wins",
                        key, json.dumps(kwargs[key]), json.dumps(value))
        kwargs[key] = value
    return kwargs


def template_source(config, vocab) -> tuple[str, str | None]:
    """(default, tool_use) sources in force; the name "chatml" is upstream's
    ChatML template, as upstream swaps it in."""
    source, tool_use = _given_source(config, vocab)
    return (CHATML if source == "chatml" else source), tool_use


def _given_source(config, vocab) -> tuple[str, str | None]:
    if config.chat_template:
        if config.chat_template_file:
            log.warning("both --chat-template and --chat-template-file given: the inline "
                        "template wins")
        return config.chat_template, None
    if config.chat_template_file:
        return Path(config.chat_template_file).read_text(encoding="utf-8"), None
    if vocab.chat_template:
        return vocab.chat_template, vocab.chat_template_tool_use
    log.warning("the checkpoint has no chat template: rendering chats as ChatML")
    return CHATML, None


def _legacy(config, source: str, tool_use: str | None, special_tokens) -> ChatSettings:
    """The legacy path: the prompt in a built-in format, output as content.
    The template is still compiled, as upstream parses it either way, for
    /props: its source, and caps read off the tool-use variant when there is
    one (upstream's choice), which itself is not reported."""
    name = legacy.detect(source)
    if name is None:
        log.warning("--no-jinja: the chat template matches none of the built-in formats; "
                    "chat requests will fail until the server runs with --jinja or a "
                    "--chat-template name")
    else:
        log.info("chat prompts are formatted with the built-in %s format", name)
    template = ChatTemplate(source, special_tokens)
    caps = template_caps(ChatTemplate(source, special_tokens, tool_use)) if tool_use \
        else template_caps(template)
    return ChatSettings(
        template=template, kwargs=template_kwargs(config),
        reasoning_format=config.chat_reasoning_format,
        prefill_assistant=config.chat_prefill_assistant, skip_parsing=True,
        think_start="", think_end="", caps=caps,
        reasoning_budget=config.chat_reasoning_budget,
        budget_message=config.chat_reasoning_budget_message or "",
        reasoning_alias=None if config.chat_reasoning_alias_field == "none"
        else config.chat_reasoning_alias_field,
        jinja=False, legacy=name, named=config.chat_jinja)


def build(config, vocab) -> ChatSettings:
    source, tool_use = template_source(config, vocab)
    if not config.chat_jinja or legacy.builtin_name(source):
        return _legacy(config, source, tool_use, vocab.special_tokens_map)
    template = ChatTemplate(source, vocab.special_tokens_map, tool_use)
    fmt = tool_format(tool_use or source)
    start, end = think_pair(source, fmt)
    thinks = bool(start or end) and (start or end) in (tool_use or "") + source
    kwargs = template_kwargs(config)
    if config.chat_reasoning == "auto":
        kwargs.setdefault("enable_thinking", thinks or toggles_thinking(template))
    return ChatSettings(
        template=template,
        kwargs=kwargs,
        reasoning_format=config.chat_reasoning_format,
        prefill_assistant=config.chat_prefill_assistant,
        skip_parsing=config.chat_skip_chat_parsing,
        think_start=start,
        think_end=end,
        tool_format=fmt,
        typed_content=renders_typed_content(template),
        caps=template_caps(template),
        thinks=thinks,
        reasoning_budget=config.chat_reasoning_budget,
        budget_message=config.chat_reasoning_budget_message or "",
        reasoning_alias=None if config.chat_reasoning_alias_field == "none"
        else config.chat_reasoning_alias_field,
    )


def toggles_thinking(template: ChatTemplate) -> bool:
    """Whether enable_thinking changes the template's generation prompt
    (a template with thinking markers of its own, Command R7B's)."""
    user = [{"role": "user", "content": "test"}]
    on = _renders(template, user, kwargs={"enable_thinking": True})
    return on is not None and on != _renders(template, user, kwargs={"enable_thinking": False})


# -- /props chat_template_caps -------------------------------------------------------------

def _renders(template: ChatTemplate, messages, tools=None, kwargs=None) -> str | None:
    try:
        return template.render(messages, tools=tools, add_generation_prompt=True, kwargs=kwargs)
    except Exception:  # noqa: BLE001 - a probe that fails to render proves nothing
        return None


def template_caps(template: ChatTemplate) -> dict[str, bool]:
    """upstream's chat_template_caps keys, in its (sorted) order.  Upstream
    reads them off its engine's variable-access statistics; here each is
    probed by rendering a small conversation and looking for a marker in
    the output, which answers the same question for templates that print
    what they read."""
    user = {"role": "user", "content": "User message"}
    tool = {"type": "function", "function": {
        "name": "probe_tool_name", "description": "Tool description",
        "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}}}}

    def call(args, n=1):
        return {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"call0000{i}", "type": "function",
             "function": {"name": f"probe_call_{i}", "arguments": args}} for i in range(n)]}

    def shows(marker, messages, **kw) -> bool:
        out = _renders(template, messages, **kw)
        return out is not None and marker in out

    after = [{"role": "tool", "content": "Tool response", "tool_call_id": "call00000"},
             {"role": "assistant", "content": "The tool response was 'tool response'"}, user]
    objects = shows("probe_value_obj", [user, call({"arg": "probe_value_obj"}), *after],
                    tools=[tool])
    args = {"arg": "v"} if objects else '{"arg": "v"}'
    reasoning = [user, {"role": "assistant", "content": "Answer",
                        "reasoning_content": "probe_reasoning"}, user]
    return {
        "supports_object_arguments": objects,
        "supports_parallel_tool_calls": shows("probe_call_1", [user, call(args, 2), *after],
                                              tools=[tool]),
        "supports_preserve_reasoning": shows("probe_reasoning", reasoning, kwargs={
            "enable_thinking": True, "preserve_reasoning": True, "preserve_thinking": True,
            "clear_thinking": False, "truncate_history_thinking": False,
            "drop_thinking": False}),
        "supports_reasoning_effort": (_renders(template, [user], kwargs={"reasoning_effort": "low"})
                                      != _renders(template, [user],
                                                  kwargs={"reasoning_effort": "high"})),
        "supports_string_content": shows("STRING_MARKER", [{"role": "user",
                                                            "content": "STRING_MARKER"}]),
        "supports_system_role": shows("System message", [
            {"role": "system", "content": "System message"}, user]),
        "supports_tool_calls": shows("probe_call_0", [user, call(args), *after]),
        "supports_tools": shows("probe_tool_name", [user], tools=[tool]),
        "supports_typed_content": renders_typed_content(template),
    }

"""Chat templates and reasoning, and the endpoint-mode options
of the native routes (embeddings, reranking, special-token output, infill
order).

The chat options feed `ServerConfig.chat_*`; chat/ and server/chat_*.py act
on them.  --reasoning, --reasoning-effort and --reasoning-preserve are, as
upstream, entries of the template kwargs (see `chat/settings.py`).
Template text is checked here, before any model is resolved: a template
that does not compile, an unreadable template file, or kwargs that are not
a JSON object stop startup with the reason.  A built-in format name
(chatml, llama3, ...) is accepted; with --no-jinja the template given must
be one of those names or text whose format llama-server's legacy path
recognises (`check_legacy_template`), as upstream checks it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from mlxcel_trio.chat.legacy import BUILTIN_NAMES, detect
from mlxcel_trio.cli.record import Option
from mlxcel_trio.cli.values import BadValue, Choice, Int, Text

CHAT_ISSUE = 4

# upstream's is_truthy / is_falsey / is_autoy vocabularies for --reasoning
_ON = ("on", "enabled", "true", "1")
_OFF = ("off", "disabled", "false", "0")
_AUTO = ("auto", "-1")


def _compiles(text: str) -> None:
    from mlxcel_trio.chat.template import TemplateError, compile_template

    try:
        compile_template(text)
    except TemplateError as exc:
        raise BadValue(str(exc)) from None


@attrs.frozen
class TemplateText:
    """Jinja template text that compiles, or a built-in format name (a
    plain word, so it compiles too)."""

    @property
    def domain(self) -> str:
        return "Jinja chat template text"

    def parse(self, text: str) -> str:
        if not text:
            raise BadValue("empty")
        _compiles(text)
        return text


def read_template_file(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadValue(f"cannot read the file ({exc.__class__.__name__}: {exc})") from None


@attrs.frozen
class TemplateFile:
    """A readable UTF-8 file holding Jinja template text that compiles."""

    @property
    def domain(self) -> str:
        return "a readable file holding a Jinja chat template"

    def parse(self, text: str) -> str:
        if not text:
            raise BadValue("empty")
        _compiles(read_template_file(text))
        return text


@attrs.frozen
class JsonObject:
    """A JSON object, kept as the text given."""

    @property
    def domain(self) -> str:
        return "a JSON object, e.g. '{\"key\": \"value\"}'"

    def parse(self, text: str) -> str:
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise BadValue(f"not valid JSON ({exc})") from None
        if not isinstance(value, dict):
            raise BadValue("not a JSON object")
        return text


@attrs.frozen
class ReasoningMode:
    """on / off / auto in upstream's spellings, normalised to those three."""

    @property
    def domain(self) -> str:
        return "one of on, off, auto (or " + ", ".join(_ON[1:] + _OFF[1:] + _AUTO[1:]) + ")"

    def parse(self, text: str) -> str:
        for word, group in (("on", _ON), ("off", _OFF), ("auto", _AUTO)):
            if text in group:
                return word
        raise BadValue("not a known value")


def check_legacy_template(values: dict[str, Any]) -> str | None:
    """With --no-jinja, the template given (inline text wins over the file)
    must select a built-in format; None when it does or Jinja is on.  The
    reason names what to do instead."""
    if values.get("chat_jinja", True):
        return None
    text = values.get("chat_template")
    if text is None and values.get("chat_template_file"):
        try:
            text = read_template_file(values["chat_template_file"])
        except BadValue:
            return None  # the file's own check reports it
    if text is None or detect(text) is not None:
        return None
    return ("the supplied chat template is not supported: with --no-jinja only "
            "llama-server's built-in formats are, and this template matches none of them; "
            "drop --no-jinja to render it with Jinja, or name a built-in format (chatml, "
            "llama3, ... as --help lists)")


def _opt(spellings, dest, help, **kw) -> Option:
    kw.setdefault("section", "server")
    kw.setdefault("owner", CHAT_ISSUE)
    return Option(spellings, dest, help, **kw)


CHAT: tuple[Option, ...] = (
    _opt(("--jinja",), "chat_jinja", "render chat prompts with the Jinja template engine; "
         "--no-jinja formats them with the built-in format the template is recognised as "
         "(no tools, output as content)", kind="bool", negations=("--no-jinja",),
         default=True, env="LLAMA_ARG_JINJA"),
    _opt(("--reasoning-format",), "chat_reasoning_format",
         "where the model's thoughts go: none (left in content), deepseek (in "
         "reasoning_content), deepseek-legacy (in both), auto (as deepseek)",
         value=Choice(("none", "deepseek", "deepseek-legacy", "auto")), metavar="FORMAT", default="auto", env="LLAMA_ARG_THINK",
         status="by_design"),
    _opt(("-rea", "--reasoning"), "chat_reasoning",
         "let the model think: on, off, or auto (the template decides); sets the "
         "template's enable_thinking", value=ReasoningMode(), metavar="[on|off|auto]",
         default="auto", env="LLAMA_ARG_REASONING"),
    _opt(("--reasoning-effort",), "chat_reasoning_effort",
         "reasoning effort handed to the chat template as reasoning_effort ('default' "
         "keeps the template's)", value=Text(), metavar="LEVEL", default="default",
         env="LLAMA_ARG_REASONING_EFFORT"),
    _opt(("--reasoning-budget",), "chat_reasoning_budget",
         "thinking token budget (-1 unlimited, 0 close the block at once); a request's "
         "reasoning_budget_tokens overrides it", value=Int(lo=-1),
         metavar="N", default=-1, env="LLAMA_ARG_THINK_BUDGET"),
    _opt(("--reasoning-budget-message",), "chat_reasoning_budget_message",
         "text forced in before the end of thinking when the budget runs out",
         value=Text(allow_empty=True), metavar="MESSAGE", default_text="none",
         env="LLAMA_ARG_THINK_BUDGET_MESSAGE"),
    _opt(("--reasoning-alias-field",), "chat_reasoning_alias_field",
         "mlxcel-trio: also send the chat routes' reasoning_content under this name "
         "(reasoning, for OpenRouter-style clients), or none for llama-server's field alone",
         value=Choice(("none", "reasoning")), metavar="{none,reasoning}", default="reasoning",
         upstream=False),
    _opt(("--reasoning-preserve",), "chat_reasoning_preserve",
         "keep earlier turns' reasoning in the rendered history (the template's "
         "preserve_reasoning)", kind="bool", negations=("--no-reasoning-preserve",),
         default_text="template default", env="LLAMA_ARG_REASONING_PRESERVE"),
    _opt(("--chat-template",), "chat_template", "a Jinja chat template to render instead of "
         "the checkpoint's (wins over --chat-template-file), or a built-in format name: "
         + ", ".join(BUILTIN_NAMES), value=TemplateText(),
         metavar="JINJA_TEMPLATE", default_text="template taken from model's metadata",
         env="LLAMA_ARG_CHAT_TEMPLATE", status="by_design"),
    _opt(("--chat-template-file",), "chat_template_file",
         "read the Jinja chat template (or a built-in format name) from a file",
         value=TemplateFile(), metavar="JINJA_TEMPLATE_FILE",
         default_text="template taken from model's metadata",
         env="LLAMA_ARG_CHAT_TEMPLATE_FILE", status="by_design"),
    _opt(("--chat-template-kwargs",), "chat_template_kwargs",
         "extra template variables as a JSON object (a request's chat_template_kwargs "
         "override them key by key)", value=JsonObject(), metavar="STRING",
         env="LLAMA_ARG_CHAT_TEMPLATE_KWARGS"),
    _opt(("--skip-chat-parsing",), "chat_skip_chat_parsing",
         "put all model output in content, parsing no reasoning or tool calls",
         kind="bool", negations=("--no-skip-chat-parsing",), default=False,
         env="LLAMA_ARG_SKIP_CHAT_PARSING"),
    _opt(("--prefill-assistant",), "chat_prefill_assistant",
         "continue a trailing assistant message instead of answering it",
         kind="bool", negations=("--no-prefill-assistant",), default=True,
         default_text="prefill enabled", env="LLAMA_ARG_PREFILL_ASSISTANT"),
)

EMBED_ISSUE = 15


def _embed(spellings: tuple[str, ...], dest: str, help: str, **kw) -> Option:
    """Embedding / reranking (engine/embedder.py, server/surfaces/embeddings.py)."""
    kw.setdefault("section", "server")
    return Option(spellings, dest, help, owner=EMBED_ISSUE, **kw)


ROUTES: tuple[Option, ...] = (
    _embed(("--embedding", "--embeddings"), "embeddings",
           "restrict to only support embedding use case; -m is an embedding checkpoint "
           "(BERT / XLM-RoBERTa, sentence-transformers layout, or a causal model's "
           "hidden states)", kind="flag",
           env="LLAMA_ARG_EMBEDDINGS", default=False, default_text="disabled",
           status="by_design"),
    _embed(("--rerank", "--reranking"), "reranking",
           "enable reranking endpoint on server; -m is a cross-encoder "
           "(...ForSequenceClassification)", kind="flag",
           env="LLAMA_ARG_RERANKING", default=False, default_text="disabled",
           status="by_design"),
    _embed(("--pooling",), "pooling",
           "pooling type for embeddings, use model default if unspecified",
           value=Choice(("none", "mean", "cls", "last", "rank")),
           metavar="{none,mean,cls,last,rank}", env="LLAMA_ARG_POOLING"),
    _embed(("--embedding-model",), "embedding_model",
           "mlxcel-trio: an embedding encoder (directory or Hugging Face repo id) served "
           "beside the chat -m on the embedding routes", value=Text(), metavar="PATH",
           upstream=False),
    _embed(("--reranker-model",), "reranker_model",
           "mlxcel-trio: a cross-encoder (directory or Hugging Face repo id) served beside "
           "the chat -m on the rerank routes", value=Text(), metavar="PATH", upstream=False),
    _embed(("--embd-normalize",), "embd_normalize",
           "normalisation for embeddings (-1=none, 0=max absolute int16, 1=taxicab, "
           "2=euclidean, >2=p-norm)", value=Int(), metavar="N", default=2),
    Option(("-sp", "--special"), "special", "render special tokens in generated text",
           kind="flag", default=False, default_text="false", section="server", owner=2),
    Option(("--spm-infill",), "spm_infill",
           "build /infill prompts suffix-first (SPM) instead of prefix-first",
           kind="flag", default=False, default_text="disabled", section="server", owner=2),
)

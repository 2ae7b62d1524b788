"""Chat templates and reasoning (issue #4), and the endpoint-mode options
of the native routes (embeddings, reranking, special-token output, infill
order: issue #2).  All deferred."""

from __future__ import annotations

import json
from typing import Any

from mlxcel_trio.cli.record import Option
from mlxcel_trio.cli.refusals import deferred
from mlxcel_trio.cli.values import Choice, Int, Text

CHAT_ISSUE = 4


def _chat(spellings: tuple[str, ...], dest: str, help: str, **kw: Any) -> Option:
    kw.setdefault("section", "server")
    return deferred(spellings, f"chat_{dest}", help, issue=CHAT_ISSUE, **kw)


def _no_kwargs(value: str) -> bool:
    """'{}' (in any spacing) adds no template arguments."""
    try:
        return json.loads(value) == {}
    except ValueError:
        return False


CHAT: tuple[Option, ...] = (
    _chat(("--jinja",), "jinja", "render chat prompts with the Jinja template engine",
          kind="bool", negations=("--no-jinja",), default=True, env="LLAMA_ARG_JINJA"),
    _chat(("--reasoning-format",), "reasoning_format",
          "where the model's thoughts go: none, deepseek, deepseek-legacy or auto",
          value=Choice(("none", "deepseek", "deepseek-legacy", "auto")),
          metavar="FORMAT", default="auto", env="LLAMA_ARG_THINK"),
    _chat(("-rea", "--reasoning"), "reasoning",
          "let the model think: on, off, or auto (from the template)",
          value=Choice(("on", "off", "auto")), metavar="[on|off|auto]", default="auto",
          env="LLAMA_ARG_REASONING"),
    _chat(("--reasoning-effort",), "reasoning_effort",
          "reasoning effort handed to the chat template (default keeps the template's)",
          value=Text(), metavar="LEVEL", default="default",
          env="LLAMA_ARG_REASONING_EFFORT"),
    _chat(("--reasoning-budget",), "reasoning_budget",
          "thinking token budget (-1 unlimited, 0 stop at once)", value=Int(),
          metavar="N", default=-1, env="LLAMA_ARG_THINK_BUDGET"),
    _chat(("--reasoning-budget-message",), "reasoning_budget_message",
          "text forced in before the end of thinking when the budget runs out",
          value=Text(), metavar="MESSAGE", default_text="none",
          env="LLAMA_ARG_THINK_BUDGET_MESSAGE"),
    _chat(("--reasoning-preserve",), "reasoning_preserve",
          "keep earlier turns' reasoning in the rendered history", kind="bool",
          negations=("--no-reasoning-preserve",), default_text="template default",
          env="LLAMA_ARG_REASONING_PRESERVE"),
    _chat(("--chat-template",), "template", "a Jinja chat template to use instead of "
          "the checkpoint's", value=Text(), metavar="JINJA_TEMPLATE",
          default_text="template taken from model's metadata",
          env="LLAMA_ARG_CHAT_TEMPLATE"),
    _chat(("--chat-template-file",), "template_file",
          "read the Jinja chat template from a file", value=Text(),
          metavar="JINJA_TEMPLATE_FILE",
          default_text="template taken from model's metadata",
          env="LLAMA_ARG_CHAT_TEMPLATE_FILE"),
    _chat(("--chat-template-kwargs",), "template_kwargs",
          "extra template arguments as a JSON object", value=Text(), metavar="STRING",
          env="LLAMA_ARG_CHAT_TEMPLATE_KWARGS", inert=_no_kwargs, accepts="'{}'"),
    _chat(("--skip-chat-parsing",), "skip_chat_parsing",
          "put all model output in content, parsing no reasoning or tool calls",
          kind="bool", negations=("--no-skip-chat-parsing",), default=False,
          env="LLAMA_ARG_SKIP_CHAT_PARSING"),
    _chat(("--prefill-assistant",), "prefill_assistant",
          "continue a trailing assistant message instead of answering it",
          kind="bool", negations=("--no-prefill-assistant",), default=True,
          default_text="prefill enabled", env="LLAMA_ARG_PREFILL_ASSISTANT"),
)

def _unserved(spellings: tuple[str, ...], dest: str, help: str, **kw) -> Option:
    """Embedding / reranking: no implementation issue yet, so owned by the
    compatibility issue (#3) until one is filed."""
    kw.setdefault("section", "server")
    return deferred(spellings, dest, help, issue=3, **kw)


ROUTES: tuple[Option, ...] = (
    _unserved(("--embedding", "--embeddings"), "embeddings",
            "serve embeddings only (needs an embedding checkpoint)", kind="flag",
            env="LLAMA_ARG_EMBEDDINGS", default_text="disabled"),
    _unserved(("--rerank", "--reranking"), "reranking",
            "serve the reranking endpoint (needs a reranker checkpoint)", kind="flag",
            env="LLAMA_ARG_RERANKING", default_text="disabled"),
    _unserved(("--pooling",), "pooling", "embedding pooling; the model's own if unset",
            value=Choice(("none", "mean", "cls", "last", "rank")),
            metavar="{none,mean,cls,last,rank}", env="LLAMA_ARG_POOLING"),
    _unserved(("--embd-normalize",), "embd_normalize",
            "embedding normalisation: -1 none, 0 int16 max-abs, 1 taxicab, "
            "2 euclidean, >2 p-norm", value=Int(), metavar="N", default=2),
    Option(("-sp", "--special"), "special", "render special tokens in generated text",
           kind="flag", default=False, default_text="false", section="server", owner=2),
    Option(("--spm-infill",), "spm_infill",
           "build /infill prompts suffix-first (SPM) instead of prefix-first",
           kind="flag", default=False, default_text="disabled", section="server", owner=2),
)

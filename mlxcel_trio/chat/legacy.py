"""llama-server's built-in chat formats: the legacy (non-Jinja) chat path.

With `--no-jinja` llama-server does not run the template: it recognises the
model family from the template text (or from a built-in name given to
`--chat-template`) and writes the prompt with a fixed per-family format that
sees only each message's role and text.  This module is that path in our
own terms:

* `FORMATS` is the one table from name to format.  Its listed names are the
  ones upstream prints under `--chat-template`; one more format (dots1) is
  reachable only by detection, as upstream has no name for it.
* `detect(text)` names the format a template text selects: an exact built-in
  name first, then the marker rules in upstream's order (the first family
  whose markers the text contains wins), else None.
* `render(name, turns, add_generation_prompt)` writes the prompt.  The
  formats are exact to the byte: the unit tests compare every one with the
  outputs llama.cpp's own formatter gives for the same conversation.
* `turns(messages)` reduces OpenAI chat messages to what the legacy path
  sees: (role, text) with text parts joined by newlines; tool calls and
  reasoning are not part of it.

Nothing here knows about requests or servers; `chat/settings.py` decides
when the legacy path is in force.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

Turn = tuple[str, str]                       # (role, text)
Writer = Callable[[Sequence[Turn], bool], str]

_CSPACE = " \t\n\v\f\r"                      # C isspace(): what upstream trims


def _trim(text: str) -> str:
    return text.strip(_CSPACE)


def _upper_ascii(text: str) -> str:
    """toupper() byte by byte in the C locale: ASCII letters only."""
    return "".join(c.upper() if "a" <= c <= "z" else c for c in text)


@attrs.frozen
class Format:
    write: Writer
    listed: bool = True                      # printed by upstream's --chat-template help


FORMATS: dict[str, Format] = {}


def _format(*names: str, listed: bool = True) -> Callable[[Writer], Writer]:
    def register(write: Writer) -> Writer:
        for name in names:
            FORMATS[name] = Format(write, listed)
        return write
    return register


def _each(line: Callable[[str, str], str], generation: str = "") -> Writer:
    """A format where every turn is written alone, then the assistant opener."""
    def write(chat: Sequence[Turn], add_gen: bool) -> str:
        return "".join(line(role, text) for role, text in chat) + (generation if add_gen else "")
    return write


def _by_role(table: Mapping[str, Callable[[str], str]], generation: str = "",
             other: Callable[[str, str], str] | None = None) -> Writer:
    """A format with one writer per role; roles outside the table are
    written by `other`, or dropped."""
    def line(role: str, text: str) -> str:
        if role in table:
            return table[role](text)
        return other(role, text) if other else ""
    return _each(line, generation)


def _register(name: str, write: Writer, listed: bool = True) -> None:
    FORMATS[name] = Format(write, listed)


# -- formats where each turn stands alone --------------------------------------------

_register("chatml", _each(lambda r, t: f"<|im_start|>{r}\n{t}<|im_end|>\n",
                          "<|im_start|>assistant\n"))
_register("phi3", _each(lambda r, t: f"<|{r}|>\n{t}<|end|>\n", "<|assistant|>\n"))
_register("phi4", _each(lambda r, t: f"<|im_start|>{r}<|im_sep|>{t}<|im_end|>",
                        "<|im_start|>assistant<|im_sep|>"))
_register("falcon3", _each(lambda r, t: f"<|{r}|>\n{t}\n", "<|assistant|>\n"))
_register("zephyr", _each(lambda r, t: f"<|{r}|>\n{t}<|endoftext|>\n", "<|assistant|>\n"))
_register("llama3", _each(
    lambda r, t: f"<|start_header_id|>{r}<|end_header_id|>\n\n{_trim(t)}<|eot_id|>",
    "<|start_header_id|>assistant<|end_header_id|>\n\n"))
_register("llama4", _each(
    lambda r, t: f"<|header_start|>{r}<|header_end|>\n\n{_trim(t)}<|eot|>",
    "<|header_start|>assistant<|header_end|>\n\n"))
_register("glmedge", _each(lambda r, t: f"<|{r}|>\n{t}", "<|assistant|>"))
_register("megrez", _each(lambda r, t: f"<|role_start|>{r}<|role_end|>{t}<|turn_end|>",
                          "<|role_start|>assistant<|role_end|>"))
_register("solar-open", _each(lambda r, t: f"<|begin|>{r}<|content|>{t}<|end|>",
                              "<|begin|>assistant"))
_register("deepseek-ocr", _each(lambda r, t: t))
_register("gpt-oss", _each(
    lambda r, t: f"<|start|>{r}<|message|>{t}" + ("<|return|>" if r == "assistant" else "<|end|>"),
    "<|start|>assistant"))
_register("seed_oss", _each(
    lambda r, t: f"<seed:bos>{r}\n{_trim(t) if r == 'assistant' else t}<seed:eos>",
    "<seed:bos>assistant\n"))
_register("kimi-k2", _each(
    lambda r, t: {"system": "<|im_system|>system<|im_middle|>",
                  "user": "<|im_user|>user<|im_middle|>",
                  "assistant": "<|im_assistant|>assistant<|im_middle|>",
                  "tool": "<|im_system|>tool<|im_middle|>"}.get(r, "") + t + "<|im_end|>",
    "<|im_assistant|>assistant<|im_middle|>"))

_register("vicuna", _by_role({"system": lambda t: f"{t}\n\n", "user": lambda t: f"USER: {t}\n",
                              "assistant": lambda t: f"ASSISTANT: {t}</s>\n"}, "ASSISTANT:"))
_register("vicuna-orca", _by_role({"system": lambda t: f"SYSTEM: {t}\n",
                                   "user": lambda t: f"USER: {t}\n",
                                   "assistant": lambda t: f"ASSISTANT: {t}</s>\n"}, "ASSISTANT:"))
_register("deepseek", _by_role({"system": lambda t: t,
                                "user": lambda t: f"### Instruction:\n{t}\n",
                                "assistant": lambda t: f"### Response:\n{t}\n<|EOT|>\n"},
                               "### Response:\n"))
_register("deepseek2", _by_role({"system": lambda t: f"{t}\n\n",
                                 "user": lambda t: f"User: {t}\n\n",
                                 "assistant": lambda t: f"Assistant: {t}<｜end▁of▁sentence｜>"},
                                "Assistant:"))
_register("deepseek3", _by_role({"system": lambda t: f"{t}\n\n",
                                 "user": lambda t: f"<｜User｜>{t}",
                                 "assistant": lambda t: f"<｜Assistant｜>{t}<｜end▁of▁sentence｜>"},
                                "<｜Assistant｜>"))


def _cohere(token: str) -> Callable[[str], str]:
    return lambda t: f"<|START_OF_TURN_TOKEN|>{token}{_trim(t)}<|END_OF_TURN_TOKEN|>"


_register("command-r", _by_role({"system": _cohere("<|SYSTEM_TOKEN|>"),
                                 "user": _cohere("<|USER_TOKEN|>"),
                                 "assistant": _cohere("<|CHATBOT_TOKEN|>")},
                                "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"))


def _bracketed(role: str, text: str, end: str) -> str:
    return f"[|{role}|]{_trim(text)}{end}"


_register("exaone3", _by_role({
    "system": lambda t: _bracketed("system", t, "[|endofturn|]\n"),
    "user": lambda t: _bracketed("user", t, "\n"),
    "assistant": lambda t: _bracketed("assistant", t, "[|endofturn|]\n")}, "[|assistant|]"))
_register("exaone4", _by_role({
    "system": lambda t: _bracketed("system", t, "[|endofturn|]\n"),
    "user": lambda t: _bracketed("user", t, "\n"),
    "assistant": lambda t: _bracketed("assistant", t, "[|endofturn|]\n"),
    "tool": lambda t: _bracketed("tool", t, "[|endofturn|]\n")}, "[|assistant|]"))
_register("exaone-moe", _by_role(
    {r: (lambda t, r=r: f"<|{r}|>\n{_trim(t)}<|endofturn|>\n")
     for r in ("system", "user", "assistant", "tool")}, "<|assistant|>\n"))
_register("grok-2", _by_role({"system": lambda t: f"System: {_trim(t)}<|separator|>\n\n",
                              "user": lambda t: f"Human: {_trim(t)}<|separator|>\n\n",
                              "assistant": lambda t: f"Assistant: {t}<|separator|>\n\n"},
                             "Assistant:"))
_register("yandex", _by_role({"user": lambda t: f" Пользователь: {t}\n\n",
                              "assistant": lambda t: f" Ассистент: {t}\n\n"},
                             " Ассистент:[SEP]"))
_register("dots1", _by_role({"system": lambda t: f"<|system|>{t}<|endofsystem|>",
                             "user": lambda t: f"<|userprompt|>{t}<|endofuserprompt|>"},
                            "<|response|>",
                            other=lambda r, t: f"<|response|>{t}<|endofresponse|>"),
          listed=False)
_register("hunyuan-moe", _by_role({"system": lambda t: f"<|startoftext|>{t}<|extra_4|>",
                                   "assistant": lambda t: f"{t}<|eos|>"},
                                  other=lambda r, t: f"<|startoftext|>{t}<|extra_0|>"))
_register("minicpm", _by_role({"user": lambda t: f"<用户>{_trim(t)}<AI>"},
                              other=lambda r, t: _trim(t)))


def _granite_3(role: str, text: str) -> str:
    call = "<|tool_call|>" if role == "assistant_tool_call" else ""
    return f"<|start_of_role|>{role}<|end_of_role|>{call}{text}<|end_of_text|>\n"


def _granite_4(role: str, text: str) -> str:
    head = ("<|start_of_role|>assistant<|end_of_role|><|tool_call|>"
            if role == "assistant_tool_call" else f"<|start_of_role|>{role}<|end_of_role|>")
    return f"{head}{text}<|end_of_text|>\n"


_GRANITE_GEN = "<|start_of_role|>assistant<|end_of_role|>"
_register("granite", _each(_granite_3, _GRANITE_GEN))
_register("granite-4.0", _each(_granite_4, _GRANITE_GEN))
_register("granite-4.1", _each(_granite_4, _GRANITE_GEN))


def _bailing_role(role: str) -> str:
    return "HUMAN" if role == "user" else _upper_ascii(role)


_register("bailing", _each(lambda r, t: f"<role>{_bailing_role(r)}</role>{t}",
                           "<role>ASSISTANT</role>"))
_register("bailing-think", _each(lambda r, t: f"<role>{_bailing_role(r)}</role>{t}",
                                 "<role>ASSISTANT</role><think>"))


# -- formats that look at the conversation as a whole ------------------------------------

@_format("bailing2")
def _bailing2(chat: Sequence[Turn], add_gen: bool) -> str:
    head = "" if chat and chat[0][0] == "system" else \
        "<role>SYSTEM</role>detailed thinking off<|role_end|>"
    body = "".join(f"<role>{_bailing_role(r)}</role>{t}<|role_end|>" for r, t in chat)
    return head + body + ("<role>ASSISTANT</role>" if add_gen else "")


def _mistral_v7(space: str) -> Writer:
    def line(role: str, text: str) -> str:
        if role == "system":
            return f"[SYSTEM_PROMPT]{space}{text}[/SYSTEM_PROMPT]"
        if role == "user":
            return f"[INST]{space}{text}[/INST]"
        return f"{space}{text}</s>"
    return _each(line)  # no assistant opener: the [/INST] already hands over


_register("mistral-v7", _mistral_v7(" "))
_register("mistral-v7-tekken", _mistral_v7(""))


def _mistral_v1_v3(lead: str, trail: str, trim_reply: bool) -> Writer:
    """[INST] opens a turn at the first message after a reply; system text
    joins the user text inside it."""
    def write(chat: Sequence[Turn], add_gen: bool) -> str:
        out, open_turn = [], False
        for role, text in chat:
            if not open_turn:
                out.append(f"{lead}[INST]{trail}")
                open_turn = True
            if role == "system":
                out.append(f"{text}\n\n")
            elif role == "user":
                out.append(f"{text}{lead}[/INST]")
            else:
                out.append(f"{trail}{_trim(text) if trim_reply else text}</s>")
                open_turn = False
        return "".join(out)
    return write


_register("mistral-v1", _mistral_v1_v3(" ", " ", False))
_register("mistral-v3", _mistral_v1_v3("", " ", True))
_register("mistral-v3-tekken", _mistral_v1_v3("", "", False))


def _llama2(system: bool, bos_inside: bool, strip: bool) -> Writer:
    """The first [INST] is written up front; later turns reopen it (with a
    BOS for the -bos variant).  Without system support, system text is
    written bare at the head of the turn."""
    def write(chat: Sequence[Turn], add_gen: bool) -> str:
        out, open_turn = ["[INST] "], True
        for role, text in chat:
            text = _trim(text) if strip else text
            if not open_turn:
                out.append("<s>[INST] " if bos_inside else "[INST] ")
                open_turn = True
            if role == "system":
                out.append(f"<<SYS>>\n{text}\n<</SYS>>\n\n" if system else f"{text}\n")
            elif role == "user":
                out.append(f"{text} [/INST]")
            else:
                out.append(f"{text}</s>")
                open_turn = False
        return "".join(out)
    return write


_register("llama2", _llama2(False, False, False))
_register("llama2-sys", _llama2(True, False, False))
_register("llama2-sys-bos", _llama2(True, True, False))
_register("llama2-sys-strip", _llama2(True, False, True))


@_format("monarch")
def _monarch(chat: Sequence[Turn], add_gen: bool) -> str:
    # the first turn goes without the <s> every later one starts with
    body = "".join(("" if i == 0 else "<s>") + f"{r}\n{t}</s>\n" for i, (r, t) in enumerate(chat))
    return body + ("<s>assistant\n" if add_gen else "")


@_format("gemma")
def _gemma(chat: Sequence[Turn], add_gen: bool) -> str:
    """No system role: system text (trimmed) leads the next non-model turn."""
    out, system = [], ""
    for role, text in chat:
        if role == "system":
            system += _trim(text)
            continue
        role = "model" if role == "assistant" else role
        out.append(f"<start_of_turn>{role}\n")
        if system and role != "model":
            out.append(f"{system}\n\n")
            system = ""
        out.append(f"{_trim(text)}<end_of_turn>\n")
    return "".join(out) + ("<start_of_turn>model\n" if add_gen else "")


@_format("orion")
def _orion(chat: Sequence[Turn], add_gen: bool) -> str:
    """No system role: system text leads the next user turn; each user turn
    already ends with the assistant opener."""
    out, system = [], ""
    for role, text in chat:
        if role == "system":
            system += text
        elif role == "user":
            lead = f"{system}\n\n" if system else ""
            system = ""
            out.append(f"Human: {lead}{text}\n\nAssistant: </s>")
        else:
            out.append(f"{text}</s>")
    return "".join(out)


@_format("openchat")
def _openchat(chat: Sequence[Turn], add_gen: bool) -> str:
    out = []
    for role, text in chat:
        if role == "system":
            out.append(f"{text}<|end_of_turn|>")
        else:
            title = _upper_ascii(role[:1]) + role[1:]
            out.append(f"GPT4 Correct {title}: {text}<|end_of_turn|>")
    return "".join(out) + ("GPT4 Correct Assistant:" if add_gen else "")


@_format("chatglm3")
def _chatglm3(chat: Sequence[Turn], add_gen: bool) -> str:
    return "[gMASK]sop" + "".join(f"<|{r}|>\n {t}" for r, t in chat) + \
        ("<|assistant|>" if add_gen else "")


@_format("chatglm4")
def _chatglm4(chat: Sequence[Turn], add_gen: bool) -> str:
    return "[gMASK]<sop>" + "".join(f"<|{r}|>\n{t}" for r, t in chat) + \
        ("<|assistant|>\n" if add_gen else "")


@_format("rwkv-world")
def _rwkv(chat: Sequence[Turn], add_gen: bool) -> str:
    """The opener follows a final user turn whatever add_generation_prompt
    says ("\\n\\n" is the model's end of turn)."""
    out = []
    for i, (role, text) in enumerate(chat):
        if role == "system":
            out.append(f"System: {_trim(text)}\n\n")
        elif role == "user":
            out.append(f"User: {_trim(text)}\n\n")
            if i == len(chat) - 1:
                out.append("Assistant:")
        elif role == "assistant":
            out.append(f"Assistant: {_trim(text)}\n\n")
    return "".join(out)


@_format("gigachat")
def _gigachat(chat: Sequence[Turn], add_gen: bool) -> str:
    has_system = bool(chat) and chat[0][0] == "system"
    out = [f"<s>{chat[0][1]}<|message_sep|>" if has_system else "<s>"]
    for role, text in chat[1 if has_system else 0:]:
        if role == "user":
            out.append(f"user<|role_sep|>{text}<|message_sep|>"
                       "available functions<|role_sep|>[]<|message_sep|>")
        elif role == "assistant":
            out.append(f"assistant<|role_sep|>{text}<|message_sep|>")
    return "".join(out) + ("assistant<|role_sep|>" if add_gen else "")


@_format("smolvlm")
def _smolvlm(chat: Sequence[Turn], add_gen: bool) -> str:
    out = ["<|im_start|>"]  # a BOS spelled like ChatML's opener; the turns are not ChatML
    for role, text in chat:
        if role == "system":
            out.append(f"{text}\n\n")
        elif role == "user":
            out.append(f"User: {text}<end_of_utterance>\n")
        else:
            out.append(f"Assistant: {text}<end_of_utterance>\n")
    return "".join(out) + ("Assistant:" if add_gen else "")


@_format("hunyuan-dense")
def _hunyuan_dense(chat: Sequence[Turn], add_gen: bool) -> str:
    out = []
    for i, (role, text) in enumerate(chat):
        if i == 0 and role == "system":
            out.append(f"{text}<｜hy_place▁holder▁no▁3｜>")
        if role == "assistant":
            out.append(f"<｜hy_Assistant｜>{text}<｜hy_place▁holder▁no▁2｜>")
        elif role == "user":
            out.append(f"<｜hy_User｜>{text}<｜hy_Assistant｜>")
    return "".join(out)


@_format("hunyuan-vl")
def _hunyuan_vl(chat: Sequence[Turn], add_gen: bool) -> str:
    out = ["<｜hy_begin▁of▁sentence｜>"]
    for i, (role, text) in enumerate(chat):
        if i == 0 and role == "system":
            out.append(f"{text}<｜hy_place▁holder▁no▁3｜>")
        elif role == "user":
            out.append(f"{text}<｜hy_User｜>")
        elif role == "assistant":
            out.append(f"{text}<｜hy_Assistant｜>")
    return "".join(out)


_PANGU = {"system": "系统", "user": "用户", "assistant": "助手", "tool": "工具",
          "function": "方法"}


@_format("pangu-embedded")
def _pangu(chat: Sequence[Turn], add_gen: bool) -> str:
    out = []
    for i, (role, text) in enumerate(chat):
        if i == 0 and role != "system":
            out.append("[unused9]系统：[unused10]")  # an empty system turn always leads
        if role in _PANGU:
            out.append(f"[unused9]{_PANGU[role]}：{text}[unused10]")
    return "".join(out) + ("[unused9]助手：" if add_gen else "")


BUILTIN_NAMES: tuple[str, ...] = tuple(sorted(n for n, f in FORMATS.items() if f.listed))
"""The names upstream lists under --chat-template, in its (sorted) order."""


# -- detection ---------------------------------------------------------------------------

def _has(*markers: str) -> Callable[[str], bool]:
    return lambda text: all(m in text for m in markers)


def _mistral_family(text: str) -> str:
    if "[SYSTEM_PROMPT]" in text:
        return "mistral-v7"
    if "' [INST] ' + system_message" in text or "[AVAILABLE_TOOLS]" in text:
        if " [INST]" in text:
            return "mistral-v1"
        if '"[INST]"' in text:
            return "mistral-v3-tekken"
        return "mistral-v3"
    if "content.strip()" in text:
        return "llama2-sys-strip"
    if "bos_token + '[INST]" in text:
        return "llama2-sys-bos"
    return "llama2-sys" if "<<SYS>>" in text else "llama2"


def _granite_family(text: str) -> str:
    if "<tool_call>" in text or "<tools>" in text:
        return "granite-4.0" if "g4_default_system_message" in text else "granite-4.1"
    return "granite"


_Rule = tuple[Callable[[str], bool], Callable[[str], str]]


def _is(name: str) -> Callable[[str], str]:
    return lambda text: name


# Upstream's marker rules, in its order: the first that matches decides.
_RULES: tuple[_Rule, ...] = (
    (_has("<|im_start|>"), lambda t: "phi4" if "<|im_sep|>" in t else
     "smolvlm" if "<end_of_utterance>" in t else "chatml"),
    (lambda t: t.startswith("mistral") or "[INST]" in t, _mistral_family),
    (_has("<|assistant|>", "<|end|>"), _is("phi3")),
    (_has("[gMASK]<sop>"), _is("chatglm4")),
    (_has("<|assistant|>", "<|user|>"), lambda t: "exaone-moe" if "<|tool_declare|>" in t
     else "falcon3" if "</s>" in t else "glmedge"),
    (_has("<|{{ item['role'] }}|>", "<|begin_of_image|>"), _is("glmedge")),
    (_has("<|user|>", "<|endoftext|>"), _is("zephyr")),
    (_has("bos_token + message['role']"), _is("monarch")),
    (_has("<start_of_turn>"), _is("gemma")),
    (_has("'\\n\\nAssistant: ' + eos_token"), _is("orion")),
    (_has("GPT4 Correct "), _is("openchat")),
    (_has("USER: ", "ASSISTANT: "), lambda t: "vicuna-orca" if "SYSTEM: " in t else "vicuna"),
    (_has("### Instruction:", "<|EOT|>"), _is("deepseek")),
    (_has("<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"), _is("command-r")),
    (_has("<|start_header_id|>", "<|end_header_id|>"), _is("llama3")),
    (_has("[gMASK]sop"), _is("chatglm3")),
    (_has("<用户>"), _is("minicpm")),
    (_has("'Assistant: ' + message['content'] + eos_token"), _is("deepseek2")),
    (_has("<｜Assistant｜>", "<｜User｜>", "<｜end▁of▁sentence｜>"), _is("deepseek3")),
    (_has("[|system|]", "[|assistant|]", "[|endofturn|]"),
     lambda t: "exaone4" if "[|tool|]" in t else "exaone3"),
    (lambda t: "rwkv-world" in t
     or "{{- 'User: ' + message['content']|trim + '\\n\\n' -}}" in t, _is("rwkv-world")),
    (_has("<|start_of_role|>"), _granite_family),
    (_has("message['role'] + additional_special_tokens[0] + message['content'] + "
          "additional_special_tokens[1]"), _is("gigachat")),
    (_has("<|role_start|>"), _is("megrez")),
    (_has(" Ассистент:"), _is("yandex")),
    (_has("<role>ASSISTANT</role>", "'HUMAN'"), _is("bailing")),
    (_has("<role>ASSISTANT</role>", '"HUMAN"', "<think>"), _is("bailing-think")),
    (_has("<role>ASSISTANT</role>", "<role>HUMAN</role>", "<|role_end|>"), _is("bailing2")),
    (_has("<|header_start|>", "<|header_end|>"), _is("llama4")),
    (_has("<|endofuserprompt|>"), _is("dots1")),
    (_has("<|extra_0|>", "<|extra_4|>"), _is("hunyuan-moe")),
    (_has("<|start|>", "<|channel|>"), _is("gpt-oss")),
    (_has("<｜hy_Assistant｜>", "<｜hy_begin▁of▁sentence｜>"), _is("hunyuan-vl")),
    (_has("<｜hy_Assistant｜>", "<｜hy_place▁holder▁no▁3｜>"), _is("hunyuan-dense")),
    (_has("<|im_assistant|>assistant<|im_middle|>"), _is("kimi-k2")),
    (_has("<seed:bos>"), _is("seed_oss")),
    (_has("'Assistant: '  + message['content'] + '<|separator|>"), _is("grok-2")),
    (_has("[unused9]系统：[unused10]"), _is("pangu-embedded")),
    (_has("<|begin|>", "<|end|>", "<|content|>"), _is("solar-open")),
)


def builtin_name(text: str) -> str | None:
    """The built-in name `text` is, exactly (upstream matches it whole)."""
    return text if text in FORMATS and FORMATS[text].listed else None


def detect(text: str) -> str | None:
    """The format llama-server's legacy path picks for this template text:
    a built-in name names itself, else the first marker rule that matches."""
    if builtin_name(text):
        return text
    for matches, name in _RULES:
        if matches(text):
            return name(text)
    return None


# -- rendering ---------------------------------------------------------------------------

def _text_of(message: Mapping[str, Any]) -> str:
    """The text the legacy path sees: string content, then each text part
    appended on a new line (a newline only once there is text before it)."""
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    if isinstance(content, list):
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                continue
            piece = part.get("text")
            piece = piece if isinstance(piece, str) else ""
            text = f"{text}\n{piece}" if text else piece
    return text


def turns(messages: Sequence[Mapping[str, Any]]) -> list[Turn]:
    """OpenAI chat messages as the legacy formats see them: (role, text);
    tool calls, reasoning and names are not part of any format."""
    return [(str(m.get("role", "")), _text_of(m)) for m in messages]


def render(name: str, chat: Sequence[Turn], add_generation_prompt: bool) -> str:
    return FORMATS[name].write(chat, add_generation_prompt)

"""chat/dialects.py against llama.cpp's own chat parser (build 10587) as the oracle.

tests/data/tool_calls/<dialect>.json hold model outputs written in each
family's own syntax, cut into streaming prefixes, and what upstream's
`common_chat_parse` made of every one of them under the same template and
request settings (README.md there says how they were produced).  For each
output of each setting, every case must come out of `dialects.parse` as it
came out of upstream's:

* `content` and `reasoning_content`: byte for byte;
* tool calls: the same number in the same order, names byte for byte, and
  arguments byte for byte once JSON whitespace outside strings is dropped
  (upstream prints some dialects' arguments as `{"a": 1}` and others as
  `{"a":1}`; that is representation, not meaning; a partial argument text is
  compared the same way, so ours must stop where upstream's stops);
* ids: only where upstream's came out of the model's own text (Mistral's
  `[CALL_ID]`, Kimi's `functions.NAME:N`, Command R's `tool_call_id`); an
  empty id upstream is one the server fills in at random, so ours is free.

Where upstream's parser throws on an output ("does not match the expected
format"), upstream fails the request; ours soft-fails by design (the issue's
rule: malformed output never fails a request): no tool calls, and the text
the model wrote ends up in content (after any reasoning taken out), nothing
invented.  On a partial prefix upstream throws on, ours must simply not
raise and report no call.

Where a known dialect does not match upstream yet, the test's id is listed
in known_divergences.txt beside the data: such a case is xfail while it
differs and fails once it matches (remove it from the list then), so the
list can only shrink and every other case is held to upstream.

A dialect `dialects` does not know yet is xfail (strict=False, "dialect not
implemented"), so its counts show; a known dialect's mismatch fails.  Known
means named in the module's table (`NAMES`, `DIALECTS`, `BY_NAME` or `TABLE`,
whichever it has), else detected for at least one template here.  Templates
of families outside the table expect "generic" (upstream's autoparser); a
few may also go by the family whose syntax they copy (`ALSO`).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
from functools import cache
from pathlib import Path

import pytest

_MODULE = "mlxcel_trio.chat.dialects"
if importlib.util.find_spec(_MODULE) is None:
    pytest.skip(f"{_MODULE} is not written yet", allow_module_level=True)
dialects = importlib.import_module(_MODULE)  # an import error in it is a failure, not a skip

DATA = Path(__file__).parents[2] / "data" / "tool_calls"
TEMPLATES = DATA / "templates"

# Upstream's name for how it reads each template (the specialised handler its
# detection picks, or its differential autoparser) -> our dialect, with the
# other names a family may reasonably go by on our side.
UPSTREAM = {
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": ("autoparser", "hermes"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": ("autoparser", "hermes"),
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("autoparser", "hermes"),
    "Qwen-Qwen3-0.6B.jinja": ("autoparser", "hermes"),
    "Qwen-QwQ-32B.jinja": ("autoparser", "hermes"),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("autoparser", "llama3"),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("autoparser", "llama3"),
    "meta-llama-Llama-3.3-70B-Instruct.jinja": ("autoparser", "llama3"),
    "Qwen3-Coder.jinja": ("Qwen3-Coder", "qwen3_coder"),
    "Qwen3.5-4B.jinja": ("Qwen3-Coder", "qwen3_coder"),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": ("Qwen3-Coder", "qwen3_coder"),
    "StepFun3.5-Flash.jinja": ("Qwen3-Coder", "qwen3_coder"),
    "openai-gpt-oss-120b.jinja": ("GPT-OSS", "gpt_oss"),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("autoparser", "mistral_nemo"),
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": ("autoparser", "mistral_small"),
    "unsloth-mistral-Devstral-Small-2507.jinja": ("Ministral/Magistral Large 3", "mistral_small"),
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": ("Ministral/Magistral Large 3", "mistral_small"),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": ("autoparser", "deepseek_r1"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": ("autoparser", "deepseek_r1"),
    "llama-cpp-deepseek-r1.jinja": ("autoparser", "deepseek_r1"),
    "deepseek-ai-DeepSeek-V3.1.jinja": ("autoparser", "deepseek_v3_1"),
    "deepseek-ai-DeepSeek-V3.2.jinja": ("DeepSeek V3.2/V4", "deepseek_dsml"),
    "deepseek-ai-DeepSeek-V4.jinja": ("DeepSeek V3.2/V4", "deepseek_dsml"),
    "GLM-4.6.jinja": ("autoparser", "glm_4_5"),
    "GLM-4.7-Flash.jinja": ("autoparser", "glm_4_5"),
    "moonshotai-Kimi-K2.jinja": ("Kimi K2 Thinking", "kimi_k2"),
    "Kimi-K2-Instruct.jinja": ("Kimi K2 Thinking", "kimi_k2"),
    "Kimi-K2-Thinking.jinja": ("Kimi K2 Thinking", "kimi_k2"),
    "Kimi-K3.jinja": ("Kimi K3", "kimi_k3"),
    "MiniMax-M2.jinja": ("autoparser", "minimax_m2"),
    "MiniMax-M3.jinja": ("MiniMax-M3", "minimax_m3"),
    "meetkai-functionary-medium-v3.1.jinja": ("autoparser", "functionary_v3_1"),
    "meetkai-functionary-medium-v3.2.jinja": ("Functionary v3.2", "functionary_v3_2"),
    "fireworks-ai-llama-3-firefunction-v2.jinja": ("autoparser", "firefunction_v2"),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": ("autoparser", "command_r7b"),
    "Cohere2MoE.jinja": ("Cohere2 MoE", "cohere2moe"),
    "ibm-granite-granite-3.3-2B-Instruct.jinja": ("autoparser", "granite"),
    "ibm-granite-granite-4.0.jinja": ("autoparser", "granite"),
    "ibm-granite-granite-4.1.jinja": ("autoparser", "granite"),
    "LFM2-8B-A1B.jinja": ("LFM2", "lfm2"),
    "LFM2.5-8B-A1B.jinja": ("LFM2.5", "lfm2"),
    "LFM2.5-Instruct.jinja": ("LFM2.5", "lfm2"),
    "Apertus-8B-Instruct.jinja": ("autoparser", "apertus"),
    "ByteDance-Seed-OSS.jinja": ("autoparser", "seed_oss"),
    "NVIDIA-Nemotron-Nano-v2.jinja": ("autoparser", "nemotron_v2"),
    "unsloth-Apriel-1.5.jinja": ("autoparser", "apriel"),
    "Apriel-1.6-15b-Thinker-fixed.jinja": ("autoparser", "apriel"),
    "google-gemma-4-31B-it.jinja": ("", "gemma4"),  # no log line: its branch names no handler
    "GigaChat3-10B-A1.8B.jinja": ("GigaChatV3", "gigachat3"),
    "GigaChat3.1-10B-A1.8B.jinja": ("autoparser", "gigachat3"),
    "openbmb-MiniCPM5-1B.jinja": ("MiniCPM5", "minicpm5"),
    "MiMo-VL.jinja": ("autoparser", "xiaomi_mimo"),
    "HuggingFaceTB-SmolLM3-3B.jinja": ("autoparser", "smollm3"),
    "deepseek-ai-DeepSeek-V4-Flash-0731.jinja": ("DeepSeek V3.2/V4", "deepseek_dsml"),
    "google-gemma-4-31B-it-interleaved.jinja": ("", "gemma4"),
    "muse-glimmer.jinja": ("Muse Glimmer", "muse_glimmer"),
    # Families outside the table: upstream's autoparser derives their syntax from the template.
    "Reka-Edge.jinja": ("autoparser", "generic"),
    "Bielik-11B-v3.0-Instruct.jinja": ("autoparser", "generic"),
    "MiniMax-M1.jinja": ("autoparser", "generic"),
    "poolside-Laguna-XS.2.jinja": ("autoparser", "generic"),
    "upstage-Solar-Open-100B.jinja": ("autoparser", "generic"),
}
# A family whose syntax is another's may go by that name on our side (by dialect, or by template).
ALSO = {"granite": {"hermes"}, "xiaomi_mimo": {"hermes"}, "cohere2moe": {"command_r7b"},
        "smollm3": {"hermes", "none"},
        "Reka-Edge.jinja": {"hermes"}, "Bielik-11B-v3.0-Instruct.jinja": {"hermes"},
        "poolside-Laguna-XS.2.jinja": {"glm_4_5"}}


def _load():
    files = sorted(p for p in DATA.glob("*.json"))
    return {p.stem: json.loads(p.read_text("utf-8")) for p in files}


_DATA = _load()


@cache
def _source(template: str) -> str:
    return (TEMPLATES / template).read_text("utf-8")


@cache
def _detected(template: str):
    return dialects.detect(_source(template))


@cache
def _known() -> frozenset[str]:
    """The dialect names `dialects` implements: its table if it exposes one, else what it detects."""
    for attr in ("NAMES", "DIALECTS", "BY_NAME", "TABLE"):
        table = getattr(dialects, attr, None)
        if table:
            items = table.values() if isinstance(table, dict) else table
            names = {getattr(t, "name", t) for t in items}
            if isinstance(table, dict):
                names |= {k for k in table if isinstance(k, str)}
            return frozenset(n for n in names if isinstance(n, str))
    return frozenset(_detected(t).name for t in UPSTREAM)


def _accepts(name: str) -> bool:
    return name in inspect.signature(dialects.parse).parameters


def _names(dialect: str, template: str) -> set[str]:
    return {dialect} | ALSO.get(dialect, set()) | ALSO.get(template, set())


def _xfail_unknown(dialect: str, template: str) -> None:
    if not _names(dialect, template) & _known():
        pytest.xfail("dialect not implemented")


def _compact(text: str) -> str:
    """JSON text without whitespace outside strings; works on a partial text too."""
    out, in_str, esc = [], False, False
    for ch in text:
        if in_str:
            out.append(ch)
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
            out.append(ch)
        elif ch not in " \t\r\n":
            out.append(ch)
    return "".join(out)


def _ours(r) -> dict:
    calls = [{"name": c.name, "arguments": _compact(c.arguments), "id": c.id} for c in r.tool_calls]
    return {"content": r.content, "reasoning_content": r.reasoning_content, "tool_calls": calls}


def _theirs(expected: dict, ours: dict) -> dict:
    calls = []
    for i, c in enumerate(expected["tool_calls"]):
        mine = ours["tool_calls"][i]["id"] if i < len(ours["tool_calls"]) else ""
        calls.append({"name": c["name"], "arguments": _compact(c["arguments"]), "id": c["id"] or mine})
    return {"content": expected["content"], "reasoning_content": expected["reasoning_content"], "tool_calls": calls}


KNOWN = frozenset(line.strip() for line in (DATA / "known_divergences.txt").read_text().splitlines()
                  if line.strip() and not line.startswith("#"))


def _against_known(request, check) -> None:
    """Run `check`; a listed divergence is xfail while it differs and a
    failure once it matches."""
    name = request.node.name
    if name not in KNOWN:
        check()
        return
    try:
        check()
    except AssertionError as exc:
        pytest.xfail(f"known divergence from upstream: {str(exc).splitlines()[0]}")
    pytest.fail(f"{name} now matches upstream: remove it from known_divergences.txt")


def _params():
    for dialect, data in _DATA.items():
        for g, group in enumerate(data["groups"]):
            s = group["setting"]
            tag = f"{s['reasoning']}-{'think' if s['thinking'] else 'nothink'}-{'tools' if s['tools'] else 'notools'}"
            for o, out in enumerate(group["outputs"]):
                yield pytest.param(dialect, g, o, id=f"{dialect}-{group['template'][:-6]}-{group['syntax']}-{tag}-"
                                                      f"{out['label']}")


def test_every_template_is_in_the_table():
    used = {g["template"] for d in _DATA.values() for g in d["groups"]}
    assert used == set(UPSTREAM)
    for dialect, data in _DATA.items():
        for group in data["groups"]:
            handler, ours = UPSTREAM[group["template"]]
            assert (group["upstream"]["handler"], dialect) == (handler, ours), group["template"]


@pytest.mark.parametrize("template", sorted(UPSTREAM))
def test_detection(template, request):
    dialect = UPSTREAM[template][1]
    _xfail_unknown(dialect, template)

    def check():
        assert _detected(template).name in _names(dialect, template)
    _against_known(request, check)


@pytest.mark.parametrize("dialect, g, o", list(_params()))
def test_parse_matches_upstream(dialect, g, o, request):
    group = _DATA[dialect]["groups"][g]
    _xfail_unknown(dialect, group["template"])
    setting, upstream = group["setting"], group["upstream"]
    extra = {}
    if _accepts("tools"):
        extra["tools"] = _DATA[dialect]["tools"] if setting["tools"] else None
    elif not setting["tools"]:
        pytest.skip("dialects.parse takes no tools: a request without tools cannot be told apart")
    if _accepts("enable_thinking"):
        # Where the prompt closed an empty thinking block (thinking off), upstream reads a
        # leading opener differently: thinking_open alone cannot tell that apart.
        extra["enable_thinking"] = setting["thinking"]
    if _accepts("generation_prompt"):
        extra["generation_prompt"] = upstream["generation_prompt"]
    _against_known(request, lambda: _compare(dialect, group, setting, upstream, o, extra))


def _compare(dialect, group, setting, upstream, o, extra) -> None:
    d = _detected(group["template"])
    text = group["outputs"][o]["text"]
    failures = []
    for out, length, partial, res in group["cases"]:
        if out != o:
            continue
        cut = text[:length]
        r = dialects.parse(d, cut, partial=bool(partial), reasoning=setting["reasoning"],
                           thinking_open=upstream["thinking_open"], **extra)
        expected = group["results"][res]
        if "error" in expected:
            # Upstream throws; ours soft-fails: no call, and (when final) the text stays as content.
            ok = not r.tool_calls and (partial or (cut.endswith(r.content) and r.reasoning_content in cut
                                                   and len(r.content) + len(r.reasoning_content) > 0))
            if not ok:
                failures.append((length, partial, "soft failure (upstream throws)", _ours(r)))
            continue
        ours = _ours(r)
        theirs = _theirs(expected, ours)
        if ours != theirs:
            failures.append((length, partial, theirs, ours))
    assert not failures, (f"{len(failures)} case(s) differ from upstream for {text!r}; first: "
                          f"len={failures[0][0]} partial={bool(failures[0][1])}\n"
                          f"  upstream: {failures[0][2]}\n  ours:     {failures[0][3]}")

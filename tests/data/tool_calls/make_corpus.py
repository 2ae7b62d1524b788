"""The tool-call conformance corpus: model outputs per dialect, in each family's own syntax.

    python make_corpus.py batch OUT.json [TEMPLATE ...]   the inputs (of those templates), one batch for the oracle
    python make_corpus.py merge ORACLE.json     the oracle's answers -> <dialect>.json here

Deterministic and pure Python: the same corpus comes out on every run.  Each
family gives a handful of complete outputs (plain content, one call, content
before a call, parallel calls, reasoning beside calls, malformed or truncated
calls), every output is parsed as final, and its prefixes are parsed as
streaming partials: every prefix for the first outputs of a setting, a
stride for the rest (the data stays small).  See README.md for how the
expected answers were produced.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "special_function", "description": "I'm special",
        "parameters": {"type": "object", "properties": {
            "arg1": {"type": "integer", "description": "The arg."}},
            "required": ["arg1"]}}},
    {"type": "function", "function": {
        "name": "python", "description": "an ipython interpreter",
        "parameters": {"type": "object", "properties": {
            "code": {"type": "string", "description": "Python code to execute."}},
            "required": ["code"]}}},
]

# (name, arguments) of the calls the outputs make, in order of use.
WEATHER = ("get_weather", {"city": "Paris", "unit": "celsius"})
SPECIAL = ("special_function", {"arg1": 1})
PYCODE = ("python", {"code": "print('hey')\nprint(\"x\")"})
CONTENT = "Hello, world!\nWhat's up?"
LEAD = "Let me check."
THOUGHT = "I'm\nthinking"

EVERY_PREFIX_OUTPUTS = 2   # outputs of a family's first setting streamed byte by byte
STRIDE = 5                 # prefix stride for its other outputs
WIDE_STRIDE = 23           # prefix stride under the other settings


def dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def scalar(value) -> str:
    """A parameter value as the XML-ish families write it: strings bare, the rest as JSON."""
    return value if isinstance(value, str) else dumps(value)


# ---- call syntaxes, one function per family: list of calls -> the text of the calls

def hermes(calls):
    return "\n".join(f"<tool_call>\n{dumps({'name': n, 'arguments': a})}\n</tool_call>" for n, a in calls)


def llama3_json(calls):
    return "; ".join(dumps({"name": n, "parameters": a}) for n, a in calls)


def llama3_tag(calls):
    return "<|python_tag|>" + llama3_json(calls)


def qwen3_coder(calls):
    return "\n".join(
        "<tool_call>\n<function=" + n + ">\n"
        + "".join(f"<parameter={k}>\n{scalar(v)}\n</parameter>\n" for k, v in a.items())
        + "</function>\n</tool_call>" for n, a in calls)


def seed_oss(calls):
    return "\n".join(
        "<seed:tool_call>\n<function=" + n + ">\n"
        + "".join(f"<parameter={k}>{scalar(v)}</parameter>\n" for k, v in a.items())
        + "</function>\n</seed:tool_call>" for n, a in calls)


def gpt_oss(calls):
    # The generation prompt ends with "<|start|>assistant": the first message's header follows it.
    return "<|call|><|start|>assistant".join(
        f"<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>{dumps(a)}" for n, a in calls)


def mistral_nemo(calls):
    return "[TOOL_CALLS]" + dumps([{"name": n, "arguments": a, "id": f"call{i:05d}"} for i, (n, a) in enumerate(calls)])


def mistral_small(calls):
    return "".join(f"[TOOL_CALLS]{n}[CALL_ID]{i:09d}[ARGS]{dumps(a)}" for i, (n, a) in enumerate(calls, 1))


def mistral_args(calls):
    return "".join(f"[TOOL_CALLS]{n}[ARGS]{dumps(a)}" for n, a in calls)


def deepseek_r1(calls):
    return ("<｜tool▁calls▁begin｜>" + "".join(
        f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{n}\n```json\n{dumps(a)}\n```<｜tool▁call▁end｜>"
        for n, a in calls) + "<｜tool▁calls▁end｜>")


def deepseek_v3_1(calls):
    return ("<｜tool▁calls▁begin｜>" + "".join(
        f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{dumps(a)}<｜tool▁call▁end｜>" for n, a in calls)
        + "<｜tool▁calls▁end｜>")


def dsml(block):
    def render(calls):
        t = "<｜DSML｜"
        body = "".join(
            f'{t}invoke name="{n}">\n'
            + "".join(f'{t}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
                      f"{scalar(v)}</｜DSML｜parameter>\n" for k, v in a.items())
            + "</｜DSML｜invoke>\n" for n, a in calls)
        return f"\n\n{t}{block}>\n{body}</｜DSML｜{block}>"
    return render


def glm(sep):
    def render(calls):
        return sep.join(
            f"<tool_call>{n}{sep}"
            + "".join(f"<arg_key>{k}</arg_key>{sep}<arg_value>{scalar(v)}</arg_value>{sep}" for k, v in a.items())
            + "</tool_call>" for n, a in calls)
    return render


def kimi_k2(calls):
    return ("<|tool_calls_section_begin|>" + "".join(
        f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{dumps(a)}<|tool_call_end|>"
        for i, (n, a) in enumerate(calls)) + "<|tool_calls_section_end|>")


def kimi_k3(calls):
    body = "".join(
        f'<|open|>call tool="{n}" index="{i}"<|sep|>'
        + "".join(f'<|open|>argument key="{k}" type="{"string" if isinstance(v, str) else "number"}"<|sep|>'
                  f"{scalar(v)}<|close|>argument<|sep|>" for k, v in a.items())
        + "<|close|>call<|sep|>" for i, (n, a) in enumerate(calls, 1))
    return f"<|open|>tools<|sep|>{body}<|close|>tools<|sep|>"


def minimax_m2(calls):
    return ("<minimax:tool_call>\n" + "".join(
        f'<invoke name="{n}">\n' + "".join(f'<parameter name="{k}">{scalar(v)}</parameter>\n' for k, v in a.items())
        + "</invoke>\n" for n, a in calls) + "</minimax:tool_call>")


def minimax_m3(calls):
    m = "]<]minimax[>["
    return (f"{m}<tool_call>\n" + "".join(
        f'{m}<invoke name="{n}">' + "".join(f"{m}<{k}>{scalar(v)}{m}</{k}>" for k, v in a.items())
        + f"{m}</invoke>\n" for n, a in calls) + f"{m}</tool_call>")


def functionary_v3_1(calls):
    return "".join(f"<function={n}>{dumps(a)}</function>" for n, a in calls)


def functionary_v3_2(calls):
    # The generation prompt ends with ">>>": the first recipient follows it directly.
    return ">>>".join(f"{n}\n{dumps(a)}" for n, a in calls)


def firefunction(calls):
    return " functools" + dumps([{"name": n, "arguments": a} for n, a in calls])


def command_r7b(calls):
    body = ",\n".join(
        "    " + dumps({"tool_call_id": str(i), "tool_name": n, "parameters": a}) for i, (n, a) in enumerate(calls))
    return f"<|START_ACTION|>[\n{body}\n]<|END_ACTION|>"


def granite_3(calls):
    return "<|tool_call|>" + dumps([{"name": n, "arguments": a} for n, a in calls])


def pythonic(value) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    return dumps(value)


def lfm2(calls):
    return "<|tool_call_start|>[" + ", ".join(
        f"{n}(" + ", ".join(f"{k}={pythonic(v)}" for k, v in a.items()) + ")" for n, a in calls) + "]<|tool_call_end|>"


def apertus(calls):
    return "<|tools_prefix|>" + dumps([{n: a} for n, a in calls]) + "<|tools_suffix|>"


def nemotron_v2(calls):
    return "<TOOLCALL>" + dumps([{"name": n, "arguments": a} for n, a in calls]) + "</TOOLCALL>"


def apriel(calls):
    return "<tool_calls>" + dumps([{"name": n, "arguments": a} for n, a in calls]) + "</tool_calls>"


def gemma4_value(v) -> str:
    return f'<|"|>{v}<|"|>' if isinstance(v, str) else dumps(v)


def gemma4(calls):
    return "".join(
        f"<|tool_call>call:{n}{{" + ",".join(f"{k}:{gemma4_value(v)}" for k, v in a.items()) + "}<tool_call|>"
        for n, a in calls)


def gigachat3(calls):
    return "".join(f"<|message_sep|>\n\nfunction call<|role_sep|>\n{dumps({'name': n, 'arguments': a})}"
                   for n, a in calls)


def gigachat31(calls):
    return "".join(f"<|function_call|>{dumps({'name': n, 'arguments': a})}" for n, a in calls)


def minicpm5(calls):
    return "".join(
        f'<function name="{n}">' + "".join(f'<param name="{k}">{scalar(v)}</param>' for k, v in a.items())
        + "</function>" for n, a in calls)


def reka(calls):
    return "\n".join(f"<tool_call>\n{dumps({'name': n, 'arguments': a})}</tool_call>" for n, a in calls)


def minimax_m1(calls):
    return "<tool_calls>\n" + "".join(dumps({"name": n, "arguments": a}) + "\n" for n, a in calls) + "</tool_calls>"


def solar(calls):
    return "<|tool_calls|>" + "".join(
        f"<|tool_call:begin|>call{i}<|tool_call:name|>{n}<|tool_call:args|>{dumps(a)}<|tool_call:end|>"
        for i, (n, a) in enumerate(calls)) + "<|calls|>"


def muse_glimmer(calls):
    def value(v):
        return dumps(v) if isinstance(v, (dict, list, bool)) or v is None else str(v)
    return MUSE_NEXT.join(
        f' to={n}<|message|><atem:function_calls>\n<atem:invoke name="{n}">\n'
        + "".join(f'<atem:parameter name="{k}">{value(v)}</atem:parameter>\n' for k, v in a.items())
        + "</atem:invoke>\n</atem:function_calls>" for n, a in calls)


# ---- families: (dialect, template, call syntax, reasoning (open, close) or None, content wrapper)

# How a family writes plain content and what separates it from calls, where not bare text and "\n".
GPT_OSS_NEXT = "<|end|><|start|>assistant"
MUSE_NEXT = "<|eom|><|start|>assistant"   # the generation prompt is "<|start|>assistant"
SHAPES = {
    "gpt_oss": {"wrap": "<|channel|>final<|message|>{}", "sep": GPT_OSS_NEXT, "after": "<|end|>"},
    "functionary_v3_2": {"wrap": "all\n{}", "sep": ">>>"},
    "command_r7b": {"wrap": "<|START_RESPONSE|>{}<|END_RESPONSE|>", "sep": ""},
    "cohere2moe": {"wrap": "<|START_TEXT|>{}<|END_TEXT|>", "sep": ""},
    "upstage-Solar-Open-100B.jinja": {"wrap": "<|content|>{}<|end|>", "sep": "<|begin|>assistant"},
    "muse_glimmer": {"wrap": " to=user<|message|>{}", "sep": MUSE_NEXT},
    "kimi_k3": {"wrap": "<|open|>response<|sep|>{}<|close|>response<|sep|>", "sep": "", "end": "<|close|>message<|sep|>"},
}


FAMILIES = [
    ("hermes", "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", hermes, None),
    ("hermes", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", hermes, None),
    ("hermes", "Qwen-Qwen2.5-7B-Instruct.jinja", hermes, None),
    ("hermes", "Qwen-Qwen3-0.6B.jinja", hermes, ("<think>", "</think>")),
    ("hermes", "Qwen-QwQ-32B.jinja", hermes, ("<think>", "</think>")),
    ("llama3", "meta-llama-Llama-3.1-8B-Instruct.jinja", llama3_json, None),
    ("llama3", "meta-llama-Llama-3.1-8B-Instruct.jinja", llama3_tag, None),
    ("llama3", "meta-llama-Llama-3.2-3B-Instruct.jinja", llama3_json, None),
    ("llama3", "meta-llama-Llama-3.3-70B-Instruct.jinja", llama3_json, None),
    ("qwen3_coder", "Qwen3-Coder.jinja", qwen3_coder, None),
    ("qwen3_coder", "Qwen3.5-4B.jinja", qwen3_coder, ("<think>", "</think>")),
    ("qwen3_coder", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", qwen3_coder, ("<think>", "</think>")),
    ("qwen3_coder", "StepFun3.5-Flash.jinja", qwen3_coder, ("<think>", "</think>")),
    ("gpt_oss", "openai-gpt-oss-120b.jinja", gpt_oss, ("<|channel|>analysis<|message|>", GPT_OSS_NEXT)),
    ("mistral_nemo", "mistralai-Mistral-Nemo-Instruct-2407.jinja", mistral_nemo, None),
    ("mistral_small", "Mistral-Small-3.2-24B-Instruct-2506.jinja", mistral_small, None),
    ("mistral_small", "unsloth-mistral-Devstral-Small-2507.jinja", mistral_args, None),
    ("mistral_small", "mistralai-Ministral-3-14B-Reasoning-2512.jinja", mistral_args, ("[THINK]", "[/THINK]")),
    ("deepseek_r1", "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", deepseek_r1, ("<think>", "</think>")),
    ("deepseek_r1", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", deepseek_r1, ("<think>", "</think>")),
    ("deepseek_r1", "llama-cpp-deepseek-r1.jinja", deepseek_r1, ("<think>", "</think>")),
    ("deepseek_v3_1", "deepseek-ai-DeepSeek-V3.1.jinja", deepseek_v3_1, ("<think>", "</think>")),
    ("deepseek_dsml", "deepseek-ai-DeepSeek-V3.2.jinja", dsml("function_calls"), ("<think>", "</think>")),
    ("deepseek_dsml", "deepseek-ai-DeepSeek-V4.jinja", dsml("tool_calls"), ("<think>", "</think>")),
    ("glm_4_5", "GLM-4.6.jinja", glm("\n"), ("<think>", "</think>")),
    ("glm_4_5", "GLM-4.7-Flash.jinja", glm(""), ("<think>", "</think>")),
    ("kimi_k2", "moonshotai-Kimi-K2.jinja", kimi_k2, None),
    ("kimi_k2", "Kimi-K2-Instruct.jinja", kimi_k2, None),
    ("kimi_k2", "Kimi-K2-Thinking.jinja", kimi_k2, ("<think>", "</think>")),
    ("kimi_k3", "Kimi-K3.jinja", kimi_k3, ("", "<|close|>think<|sep|>")),
    ("minimax_m2", "MiniMax-M2.jinja", minimax_m2, ("<think>", "</think>")),
    ("minimax_m3", "MiniMax-M3.jinja", minimax_m3, ("<mm:think>", "</mm:think>")),
    ("functionary_v3_1", "meetkai-functionary-medium-v3.1.jinja", functionary_v3_1, None),
    ("functionary_v3_2", "meetkai-functionary-medium-v3.2.jinja", functionary_v3_2, None),
    ("firefunction_v2", "fireworks-ai-llama-3-firefunction-v2.jinja", firefunction, None),
    ("command_r7b", "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", command_r7b,
     ("<|START_THINKING|>", "<|END_THINKING|>")),
    ("cohere2moe", "Cohere2MoE.jinja", command_r7b, ("<|START_THINKING|>", "<|END_THINKING|>")),
    ("granite", "ibm-granite-granite-3.3-2B-Instruct.jinja", granite_3, ("<think>", "</think>")),
    ("granite", "ibm-granite-granite-4.0.jinja", hermes, None),
    ("granite", "ibm-granite-granite-4.1.jinja", hermes, None),
    ("lfm2", "LFM2-8B-A1B.jinja", lfm2, None),
    ("lfm2", "LFM2.5-8B-A1B.jinja", lfm2, ("<think>", "</think>")),
    ("lfm2", "LFM2.5-Instruct.jinja", lfm2, None),
    ("apertus", "Apertus-8B-Instruct.jinja", apertus, ("<|inner_prefix|>", "<|inner_suffix|>")),
    ("seed_oss", "ByteDance-Seed-OSS.jinja", seed_oss, ("<seed:think>", "</seed:think>")),
    ("nemotron_v2", "NVIDIA-Nemotron-Nano-v2.jinja", nemotron_v2, ("<think>", "</think>")),
    ("apriel", "unsloth-Apriel-1.5.jinja", apriel, None),
    ("apriel", "Apriel-1.6-15b-Thinker-fixed.jinja", apriel, ("", "\n[BEGIN FINAL RESPONSE]\n")),
    ("gemma4", "google-gemma-4-31B-it.jinja", gemma4, ("<|channel>thought\n", "<channel|>")),
    ("gigachat3", "GigaChat3-10B-A1.8B.jinja", gigachat3, None),
    ("gigachat3", "GigaChat3.1-10B-A1.8B.jinja", gigachat31, None),
    ("minicpm5", "openbmb-MiniCPM5-1B.jinja", minicpm5, ("<think>", "</think>")),
    ("xiaomi_mimo", "MiMo-VL.jinja", hermes, ("<think>", "</think>")),
    ("smollm3", "HuggingFaceTB-SmolLM3-3B.jinja", hermes, ("<think>", "</think>")),
    ("deepseek_dsml", "deepseek-ai-DeepSeek-V4-Flash-0731.jinja", dsml("tool_calls"), ("<think>", "</think>")),
    ("gemma4", "google-gemma-4-31B-it-interleaved.jinja", gemma4, ("<|channel>thought\n", "<channel|>")),
    ("muse_glimmer", "muse-glimmer.jinja", muse_glimmer, (" to=self<|message|>", MUSE_NEXT)),
    # Families outside the table: upstream's autoparser derives them from the template.
    ("generic", "Reka-Edge.jinja", reka, ("<think>", "</think>")),
    ("generic", "Bielik-11B-v3.0-Instruct.jinja", hermes, ("<think>", "</think>")),
    ("generic", "MiniMax-M1.jinja", minimax_m1, None),
    ("generic", "poolside-Laguna-XS.2.jinja", glm("\n"), ("<think>", "</think>")),
    ("generic", "upstage-Solar-Open-100B.jinja", solar, ("<|think|>", "<|end|><|begin|>assistant")),
]


def outputs(dialect, template, syntax, think):
    """(label, text) pairs of complete outputs for one family."""
    shape = SHAPES.get(template) or SHAPES.get(dialect, {})
    wrap, sep, end = shape.get("wrap", "{}").format, shape.get("sep", "\n"), shape.get("end", "")
    one = syntax([WEATHER])
    two = syntax([WEATHER, SPECIAL])
    bad = syntax([("get_weather", {"city": "Paris"})])
    bad = bad.replace('"Paris"', '"Paris', 1) if '"Paris"' in bad else bad.replace("Paris<", "Paris", 1).replace(
        "Paris", "Paris<", 1)
    out = [
        ("call", one + end),
        ("content_then_call", wrap(LEAD) + sep + one + end),
        ("parallel", two + end),
        ("content", wrap(CONTENT) + end),
        ("code_call", syntax([PYCODE]) + end),
        ("truncated_call", one[: max(1, len(one) * 2 // 3)]),
        ("bad_json_call", bad + end),
        ("unknown_tool", syntax([("launch_rocket", {"target": "moon"})]) + end),
        ("call_then_content", one + shape.get("after", "") + sep + wrap(CONTENT) + end),
        ("unicode_call", syntax([("get_weather", {"city": 'Zürich "東京"'})]) + end),
        ("blank_then_call", "\n\n" + one + end),
    ]
    if think:
        open_, close = think
        out += [
            ("reasoning_content", f"{open_}{THOUGHT}{close}{wrap(CONTENT)}{end}"),
            ("reasoning_call", f"{open_}{THOUGHT}{close}{one}{end}"),
            ("reasoning_parallel", f"{open_}{THOUGHT}{close}{two}{end}"),
            ("open_reasoning_content", f"{THOUGHT}{close}{wrap(CONTENT)}{end}"),
            ("open_reasoning_call", f"{THOUGHT}{close}{one}{end}"),
            ("unclosed_reasoning", f"{open_}{THOUGHT}"),
        ]
    return out


def settings(think):
    """Request settings a family is parsed under: reasoning placement, thinking, tools."""
    base = [{"reasoning": "auto", "thinking": True, "tools": True},
            {"reasoning": "auto", "thinking": True, "tools": False}]
    if think:
        base += [{"reasoning": "none", "thinking": True, "tools": True},
                 {"reasoning": "auto", "thinking": False, "tools": True}]
    return base


def prefix_lengths(text: str, step: int) -> list[int]:
    return list(range(1, len(text), step))


def corpus():
    """Groups of cases, one per (template, syntax, setting).

    A case is an output (by index) cut to a length, parsed as partial or as
    final; every output is parsed whole both ways.  The first setting of a
    family streams its first outputs byte by byte, the rest by a stride.
    """
    groups = []
    for dialect, template, syntax, think in FAMILIES:
        for s, setting in enumerate(settings(think)):
            seen: set[str] = set()
            outs = []
            for label, text in outputs(dialect, template, syntax, think):
                if text not in seen and (setting["tools"] or "call" not in label and "parallel" not in label):
                    seen.add(text)
                    outs.append({"label": label, "text": text})
            cases = []
            for i, out in enumerate(outs):
                n = len(out["text"])
                step = 1 if s == 0 and i < EVERY_PREFIX_OUTPUTS else STRIDE if s == 0 else WIDE_STRIDE
                cases += [{"output": i, "len": k, "partial": True} for k in prefix_lengths(out["text"], step)]
                cases += [{"output": i, "len": n, "partial": True}, {"output": i, "len": n, "partial": False}]
            groups.append({"dialect": dialect, "template": template, "syntax": syntax.__qualname__.split(".")[0],
                           "setting": setting, "outputs": outs, "cases": cases})
    return groups


def batch(path: Path, only: list[str]) -> None:
    jobs = [{"group": i, "template": str(TEMPLATES / g["template"]),
             "tools": TOOLS if g["setting"]["tools"] else None,
             "reasoning_format": g["setting"]["reasoning"],
             "enable_thinking": g["setting"]["thinking"],
             "parallel_tool_calls": True,
             "texts": [{"text": g["outputs"][c["output"]]["text"][: c["len"]], "partial": c["partial"]}
                       for c in g["cases"]]} for i, g in enumerate(corpus()) if not only or g["template"] in only]
    path.write_text(json.dumps({"jobs": jobs}, ensure_ascii=False), "utf-8")


def thinking_open(prompt: str, start: str) -> bool:
    """Whether the generation prompt leaves a thinking block open (the model starts inside it)."""
    if not start or start not in prompt:
        return False
    return prompt.rstrip().endswith(start.strip()) or prompt.rfind(start) > max(
        prompt.rfind("</think>"), prompt.rfind("<channel|>"), prompt.rfind("[/THINK]"))


def merge(path: Path) -> None:
    answers = json.loads(path.read_text("utf-8"))["jobs"]
    groups = corpus()
    picked = [groups[a["group"]] for a in answers]
    # A dialect file is rewritten whole, so every group of an answered dialect must be answered.
    assert all(g in picked for g in groups if g["dialect"] in {p["dialect"] for p in picked})
    by_dialect: dict[str, list] = {}
    counts: Counter = Counter()
    for g, a in zip(picked, answers, strict=True):
        if "setup_error" in a:
            print(f"skip {g['template']} {g['setting']}: {a['setup_error'][:120]}", file=sys.stderr)
            continue
        results: list = []      # distinct answers; a case names its answer by index
        index: dict[str, int] = {}
        cases = []
        for c, r in zip(g["cases"], a["results"], strict=True):
            r = {"error": r["error"]} if "error" in r else {
                k: r[k] for k in ("content", "reasoning_content", "tool_calls")}
            key = json.dumps(r, ensure_ascii=False, sort_keys=True)
            if key not in index:
                index[key] = len(results)
                results.append(r)
            cases.append([c["output"], c["len"], int(c["partial"]), index[key]])
        counts[g["dialect"]] += len(cases)
        by_dialect.setdefault(g["dialect"], []).append({
            "template": g["template"], "syntax": g["syntax"], "setting": g["setting"],
            "outputs": g["outputs"], "results": results, "upstream": {"format": a["format"], "handler": a["handler"],
                         "generation_prompt": a["generation_prompt"],
                         "thinking_start_tag": a["thinking_start_tag"],
                         "thinking_open": thinking_open(a["generation_prompt"], a["thinking_start_tag"])},
            "cases": cases})  # [output index, length, partial, result index]
    for dialect, entries in by_dialect.items():
        out = {"dialect": dialect, "tools": TOOLS, "groups": entries}
        (HERE / f"{dialect}.json").write_text(json.dumps(out, ensure_ascii=False, separators=(",", ":")) + "\n", "utf-8")
    for dialect, n in sorted(counts.items()):
        print(f"{dialect}: {n}")


if __name__ == "__main__":
    mode, arg = sys.argv[1], Path(sys.argv[2])
    batch(arg, sys.argv[3:]) if mode == "batch" else merge(arg)

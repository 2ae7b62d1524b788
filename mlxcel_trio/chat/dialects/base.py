"""What every dialect shares: the parse result, the dialect record, and the
marker engine most families' tool calls fit.

A dialect's `split(answer, partial, tools)` turns the answer (the text after
any thinking block) into items in output order: content strings and
`ToolCall`s.  The rule every split keeps, because a stream sends the
difference between successive partial parses: a partial parse is a prefix
of every later parse.  So while the text could still become a call (a tail
that may be the start of a marker, a call whose name is not complete) it is
held back, and a call once named stays a call, even if the output ends
before the call does.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Callable, Sequence

import attrs

from ..jsonscan import Incomplete, Invalid, scan_value, skip_ws

log = logging.getLogger("mlxcel.chat")


# Thinking marker pairs, the first whose opener a template spells wins.
THINK_MARKERS: tuple[tuple[str, str], ...] = (
    ("<think>", "</think>"),
    ("<seed:think>", "</seed:think>"),
    ("\u25c1think\u25b7", "\u25c1/think\u25b7"),
)
NO_THINK = ("", "")  # the template has no thinking block: none is read


@attrs.frozen
class ToolCall:
    name: str
    arguments: str                  # JSON text (a prefix of it while still arriving)
    id: str = ""
    complete: bool = attrs.field(default=True, eq=False)  # its call was closed


@attrs.frozen
class Parsed:
    content: str = ""
    reasoning_content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


Tools = Sequence[dict] | None
Split = Callable[[str, bool, Tools], list]


@attrs.frozen
class Dialect:
    """One family's output: how to recognise its template, where its
    thoughts go, how its calls are written, and how a call is forced."""

    name: str
    detect: Callable[[str], bool]
    split: Split | None = None                 # None: no tool calls (content only)
    think: tuple[str, str] | None = None       # None: the template's own thinking markers
    # the markers are the family's whatever the template spells (upstream's
    # specialised handler); otherwise they are read from the template (think_of)
    fixed_think: bool = False
    # a whole-message reader replacing the think/answer split (GPT-OSS channels):
    # (text, partial, reasoning, thinking_open, tools) -> Parsed
    message: Callable[..., Parsed] | None = None
    # forced calls: the text that opens one (a name, or None for any tool) ...
    opener: Callable[[str | None], str] | None = None
    # ... and the Lark grammar of what follows it: (tools, name, parallel) -> grammar
    grammar: Callable[[Sequence[dict], str | None, bool], str] | None = None
    # the reasoning block a forced call may follow, where it is no thinking
    # marker pair (GPT-OSS's analysis message): (its opening, its close)
    thought: tuple[str, str] | None = None
    content_wrap: tuple[str, str] | None = None  # markers around the answer (Command R7B)
    # False: upstream leaves the wrapper in the content where the request
    # offers tools (Solar Open under its autoparser)
    unwraps_with_tools: bool = True
    # upstream's differences in what it reads: its split runs on a request
    # without tools (Functionary v3.2's recipients), and under reasoning
    # "none" its thinking markers are plain text (calls read anywhere)
    reads_without_tools: bool = False
    none_is_flat: bool = True
    drops_after_calls: bool = False  # text after the last call is no part of the message
    # where the prompt opened a thinking block, a call section starting with
    # one of these (a call to an offered tool) ends the thoughts unclosed, as
    # upstream's grammar makes the block optional before calls
    calls_end_thoughts: tuple[str, ...] = ()
    # the thoughts as upstream's autoparser returns them: from the prompt's
    # opener on (the blank it ends with included), not trimmed
    raw_thoughts: bool = False
    # ... less the blank the opener ends with where the template writes past
    # thoughts after the same opener, blank included (MiniMax M2's `<think>\n`)
    opener_blank: bool = True
    blank_content: bool = False  # blank lines beside a call stay content, as upstream's
    settles: bool = True  # arriving arguments lose trailing blanks (the split may do its own)
    trims_thought_lead: bool = False  # arriving thoughts lose their leading blanks, as upstream's
    # upstream's autoparser with the template's bare closing marker (SmolLM3):
    # the blanks the model starts with are dropped, and where the prompt closed
    # an empty block, what the prompt wrote after its close leads the content
    prompt_tail: bool = False
    # where the prompt closed an empty thinking block, one the model writes
    # anyway is still thoughts (Gemma 4's handler; elsewhere it is content)
    thinks_after_close: bool = False


def think_of(dialect: Dialect, source: str) -> tuple[str, str]:
    """The thinking markers `dialect` reads under the template `source`: its
    fixed ones, else the first pair the template spells (the family's own
    first), else none, as upstream's autoparser finds no thinking block in a
    template that spells no marker."""
    if dialect.fixed_think:
        return dialect.think or THINK_MARKERS[0]
    for start, end in ((dialect.think,) if dialect.think else ()) + THINK_MARKERS:
        if (start or end).strip() and (start or end).strip() in source:
            return start, end
    return NO_THINK


def held_suffix(text: str, marker: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def hold(text: str, *markers: str) -> str:
    """`text` less any tail that could be the start of one of `markers`."""
    cut = max((held_suffix(text, m) for m in markers), default=0)
    return text[:len(text) - cut]


def soft_failure(dialect: str, text: str) -> None:
    """upstream's soft failure: an unreadable call is content, said once."""
    log.warning("%s: a tool call could not be parsed and is returned as content: %.80r",
                dialect, text)


# -- the marker engine ---------------------------------------------------------------------

UNDECIDED = "undecided"   # partial: the text may still become a call
INVALID = "invalid"       # not a call: the marker is text
Block = Callable[[str, int, bool, Tools], Any]  # -> UNDECIDED | INVALID | (calls, end | None)


def marked(name: str, opener: str, block: Block) -> Split:
    """A split for calls that start at `opener`, read by `block` from just
    after it: UNDECIDED, INVALID, or (calls, the index after the block,
    None when the output ends inside it)."""

    def split(rest: str, partial: bool, tools: Tools = None) -> list:
        items: list = []
        pos = 0
        while True:
            i = rest.find(opener, pos)
            if i < 0:
                tail = rest[pos:]
                return [*items, hold(tail, opener) if partial else tail]
            got = block(rest, i + len(opener), partial, tools)
            if got == UNDECIDED and partial:
                return [*items, rest[pos:i]]
            if got in (UNDECIDED, INVALID):
                if not partial:
                    soft_failure(name, rest[i:])
                items.append(rest[pos:i + len(opener)])
                pos = i + len(opener)
                continue
            calls, end = got
            items += [rest[pos:i], *calls]
            if end is None:
                return items
            pos = end
    return split


# -- pieces of calls ---------------------------------------------------------------------

_NAME = re.compile(r"[^\s<>\[\]{}\"'`|]+")


def read_name(s: str, i: int, stop: str, partial: bool, also: tuple[str, ...] = ()):
    """A function name from `s[i]` up to the `stop` marker: (name, index
    after the marker), UNDECIDED or INVALID; while the stop is not written
    yet, a tail that may start it (or one of `also`) is no part of the name."""
    j = s.find(stop, i)
    if j < 0:
        tail = s[i:].strip()
        ok = not tail or _NAME.fullmatch(hold(tail, stop, *also) or "x")
        return UNDECIDED if partial and ok else INVALID
    name = s[i:j].strip()
    if not _NAME.fullmatch(name):
        return INVALID
    return name, j + len(stop)


def read_json(s: str, i: int):
    """A JSON value at `s[i]` (after blanks): (text, end) when complete,
    (text so far, None) when the output ends inside it; INVALID otherwise."""
    i = skip_ws(s, i)
    try:
        end = scan_value(s, i)
    except Incomplete:
        return s[i:], None
    except Invalid:
        return INVALID
    return s[i:end], end


def json_call(name: str, s: str, i: int, close: str, partial: bool):
    """Arguments as one JSON object then `close`: (call, end) or INVALID.
    A partial call ends at None."""
    got = read_json(s, i)
    if got == INVALID and s.startswith("{", skip_ws(s, i)):
        # arguments that break as JSON once begun: the named call stands, still
        # open, with the rest of the output (upstream's lenient read; a raw
        # newline in a string left open is where this shows)
        return ToolCall(name, s[skip_ws(s, i):], complete=False), None
    if got == INVALID or (got[1] is None and got[0] and not got[0].startswith("{")):
        return INVALID
    args, end = got
    if end is None:
        return ToolCall(name, args, complete=False), None
    if not args.startswith("{"):
        return INVALID
    close = close.lstrip()
    k = skip_ws(s, end)
    if s.startswith(close, k):
        return ToolCall(name, args), k + len(close)
    if partial and close.startswith(s[k:]):
        return ToolCall(name, args, complete=False), None
    if not close:
        return ToolCall(name, args), end
    return INVALID if not partial else (ToolCall(name, args), end)


def param_schema(tools: Tools, name: str, key: str) -> dict:
    """The schema the tool gives its parameter `key` ({}: unknown)."""
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else {}
        if fn.get("name") == name:
            props = (fn.get("parameters") or {}).get("properties") or {}
            spec = props.get(key)
            return spec if isinstance(spec, dict) else {}
    return {}


def string_typed(tools: Tools, name: str, key: str) -> bool | None:
    """Whether the tool's schema types `key` as a string (None: unknown)."""
    kind = param_schema(tools, name, key).get("type")
    return kind == "string" if kind else None


def arg_value(tools: Tools, name: str, key: str, value: str, raw: bool = False) -> str:
    """A parameter's text as JSON: a string where the schema says so, else
    the value as written when it is JSON, else the value as a string
    (trimmed, unless `raw` and the schema says string)."""
    text = value.strip()
    typed = string_typed(tools, name, key)
    if typed is not True:
        try:
            json.loads(text)
            return text
        except ValueError:
            pass
    return json.dumps(value if raw and typed else text, ensure_ascii=False)


def args_object(pairs: list[tuple[str, str]], closed: bool) -> str:
    """`{"k":v,...}` from (key, JSON text) pairs, compact as upstream's."""
    body = ",".join(json.dumps(k, ensure_ascii=False) + ":" + v for k, v in pairs)
    return "{" + body + ("}" if closed else "")


def tagged_params(s: str, i: int, name: str, tools: Tools, key_open: str, key_close: str,
                  value_close: str, end: str, partial: bool, value_open: str = "",
                  lag: bool = False, key_lag: bool = True, key_end: str = "",
                  raw: bool = False):
    """Parameters written as tags (`<parameter=k>v</parameter>`,
    `<arg_key>k</arg_key><arg_value>v</arg_value>`) until `end`: (call,
    the index after `end`, or None while arriving) or INVALID.

    With `lag` a partial parse reports a key only once its value has begun,
    as upstream's streams do; without `key_lag`, as soon as its close is
    written (upstream's autoparser: `{"city":"` at `<parameter=city>`), or
    its `key_end` (MiniMax M2's quote of `">`: the name can grow no more).
    `raw`: a string value is the text as written, blanks included (upstream's
    autoparser reads it up to the close)."""
    pairs: list[tuple[str, str]] = []
    j = i

    def arriving():
        return _open_call(name, pairs, partial or lag)

    def keyed(key: str, value: str = "") -> tuple:
        head = args_object(pairs, False) + ("," if pairs else "")
        return ToolCall(name, head + json.dumps(key, ensure_ascii=False) + ":" + value,
                        complete=False), None
    while True:
        k = skip_ws(s, j)
        if s.startswith(end, k):
            return ToolCall(name, args_object(pairs, True)), k + len(end)
        if s.startswith(key_open, k):
            ke = s.find(key_close, k + len(key_open))
            if ke < 0:
                q = s.find(key_end, k + len(key_open)) if key_end and partial else -1
                if q >= 0 and key_close.startswith(s[q:]):
                    return keyed(s[k + len(key_open):q].strip())
                return arriving()
            key = s[k + len(key_open):ke].strip()
            v = ke + len(key_close)
            if value_open:
                after_key = v
                v = skip_ws(s, v)
                if not s.startswith(value_open, v):
                    if partial and value_open.startswith(s[v:]):
                        if lag and (after_key < len(s) or not key_lag):
                            # upstream's stream takes the key in (`{"city":`)
                            # once something follows its close (or at once)
                            return keyed(key)
                        return _open_call(name, pairs, partial)
                    return INVALID
                v += len(value_open)
            ve = s.find(value_close, v)
            if ve < 0:
                so_far = hold(s[v:], value_close)
                so_far = so_far if raw else so_far.strip()
                if lag and key_lag and v >= len(s) and not value_open:
                    return arriving()
                if (partial or lag) and string_typed(tools, name, key):
                    # a string streams as written, as upstream's (`{"city":"Pari`)
                    return keyed(key, json.dumps(so_far, ensure_ascii=False)[:-1])
                if lag:  # another value streams as written (`{"arg1":1`), an untyped one once done
                    typed = string_typed(tools, name, key) is False
                    return keyed(key, so_far.strip() if typed else "")
                return _open_call(name, pairs, partial)
            pairs.append((key, arg_value(tools, name, key, s[v:ve], raw)))
            j = ve + len(value_close)
            continue
        tail = s[k:]
        if partial and (end.startswith(tail) or key_open.startswith(tail)):
            return arriving()
        if not partial and not tail:
            return ToolCall(name, args_object(pairs, True), complete=False), None
        if not partial and (end.startswith(tail) or key_open.startswith(tail)):
            # the output ends inside a marker: the call stands as streamed (upstream's lenient end)
            return ToolCall(name, args_object(pairs, False), complete=False), None
        return INVALID


def _open_call(name: str, pairs, partial: bool):
    return ToolCall(name, args_object(pairs, not partial), complete=False), None


# -- forced-call grammars ------------------------------------------------------------------

def lark(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def functions(tools: Sequence[dict], name: str | None) -> list[dict]:
    return [t["function"] for t in tools if name is None or t["function"]["name"] == name]


def schema_rule(fn: dict) -> str:
    from ...grammar.compile import JSON_WHITESPACE, upstream_schema
    schema = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
    schema = {"x-guidance": {"whitespace_pattern": JSON_WHITESPACE}, **upstream_schema(schema)}
    return "%json " + json.dumps(schema, ensure_ascii=False)


_TAG = re.compile(r"(<[^<>\s]+>)")


def marker(text: str, token_of: Callable[[str], int | None]) -> str:
    """Marker text as lark: each tag in it (`</think>`, `<|end|>`) as its
    text or as its one token where the vocabulary has it as one (llguidance
    matches an added token by its id, never by its text)."""
    parts = []
    for k, piece in enumerate(_TAG.split(text)):
        if not piece:
            continue
        tok = token_of(piece) if k % 2 else None
        parts.append(lark(piece) if tok is None else f"({lark(piece)} | <[{tok}]>)")
    return " ".join(parts) or '""'


def _escaped(text: str) -> str:
    return "".join(c if c.isascii() and c.isalnum() else "\\x{%x}" % ord(c) for c in text)


def after_thoughts(grammar: str, opener: str, close: str, open_: str | None,
                   token_of: Callable[[str], int | None], gap: bool = True) -> str:
    """A forced call's grammar with a reasoning block first, as vLLM forces
    a call once the reasoning ends: thoughts, `close`, a blank or two
    (`gap`), then `opener` and the call.  `open_` None: the prompt opened
    the block; otherwise the model may open it (or skip it and call at once).

    llguidance lexes greedily and never backs up, so thoughts that may
    contain any text cannot be one lexeme followed by the close's: on the
    close's first bytes both would still be alive and the text lexeme would
    swallow them.  The thoughts' lexeme therefore ends with the first
    occurrence of the close's first tag (THOUGHT_END); where the vocabulary
    has that tag as one token, thoughts without it then the token is the
    other way out."""
    head_match = _TAG.match(close)  # the thoughts end at the close's first tag
    head = head_match.group(1) if head_match else close
    rest = close[len(head):]
    h = _escaped(head)
    ways = ["THOUGHT_END"]
    rules = [f"THOUGHT_END: /(?s:.*){h}/ & ~/(?s:.*{h}.+)/"]
    tok = token_of(head)
    if tok is not None:
        ways.append(f"THOUGHT <[{tok}]>")
        rules.append(f"THOUGHT: /(?s:.*)/ & ~/(?s:.*{h}.*)/")
    block = "(" + " | ".join(ways) + ")"
    if rest:
        block += " " + marker(rest, token_of)
    if gap:
        block += r" /\n{0,2}/"
    if open_ is not None:
        block = f"({marker(open_, token_of)} {block})?"
    return (f"start: {block} {marker(opener, token_of)} forced\n"
            + "".join(r + "\n" for r in rules)
            + grammar.replace("start: ", "forced: ", 1))


def _grammar(call_of, between: str | None) -> Callable:
    def grammar(tools: Sequence[dict], name: str | None, parallel: bool) -> str:
        fns = functions(tools, name)
        rules: list[str] = []
        alts = [call_of(i, fn, name is not None, rules) for i, fn in enumerate(fns)]
        more = f" ({lark(between)} call)*" if parallel and name is None and between else ""
        return (f"start: call{more}\ncall: " + " | ".join(alts) + "\n"
                + "\n".join(rules) + "\n")
    return grammar


def _seq(*parts: str) -> str:
    return " ".join(p for p in parts if p and p != '""')


def json_grammar(after_name: str, tail: str, between: str | None = None) -> Callable:
    """Calls written `opener name after_name JSON-args tail`: the opener
    writes up to the name (a named call's, up to its arguments)."""

    def call_of(i: int, fn: dict, named: bool, rules: list[str]) -> str:
        rules.append(f"a{i}: " + schema_rule(fn))
        head = "" if named else lark(fn["name"] + after_name)
        return _seq(head, f"a{i}", lark(tail))
    return _grammar(call_of, between)


def tag_grammar(after_name: str, key_open: str, key_close: str, value_close: str,
                tail: str, between: str | None = None,
                key_close_json: str | None = None,
                head_of: Callable[[str], str] | None = None) -> Callable:
    """Calls written as tags: `opener name after_name (key_open K key_close
    V value_close)* tail`; a string parameter's value is any text without
    '<', another is JSON of its schema (its key closed by `key_close_json`
    where the family marks the two apart); `head_of(name)` replaces `name
    after_name` where the family writes the name more than once."""

    def call_of(i: int, fn: dict, named: bool, rules: list[str]) -> str:
        params_schema = fn.get("parameters") or {}
        props = params_schema.get("properties") or {}
        required = set(params_schema.get("required") or ())
        params = []
        for k, (key, spec) in enumerate(props.items()):
            text = (spec or {}).get("type") == "string"
            value = "/[^<]*/" if text else \
                schema_rule({"parameters": spec if isinstance(spec, dict) else {}})
            rules.append(f"v{i}_{k}: {value}")
            close = key_close if text or key_close_json is None else key_close_json
            # each parameter once, in the schema's order; the optional ones may be left out
            param = _seq(lark(key_open + key + close), f"v{i}_{k}", lark(value_close))
            params.append(param if key in required else f"({param})?")
        head = "" if named else lark(head_of(fn["name"]) if head_of else fn["name"] + after_name)
        return "(" + _seq(head, *params, lark(tail)) + ")"
    return _grammar(call_of, between)


def invoke_block(inv_open: str, name_stop: str, key_open: str, key_close: str,
                 value_close: str, inv_close: str, section_close: str,
                 value_open: str = "", many: bool = True, lag: bool = False,
                 key_lag: bool = True, key_end: str = "", raw: bool = False) -> Block:
    """A block of calls written as tags: `(inv_open NAME name_stop params
    inv_close)+ section_close` (one call when not `many`); `lag`: partial
    calls as upstream streams them (tagged_params), the closing brace held
    until the section closes; `key_lag`, `key_end`, `raw`: as tagged_params."""

    def block(s: str, j: int, partial: bool, tools: Tools):
        calls: list[ToolCall] = []
        if lag and partial and not s.endswith(section_close) and any(
                s.endswith(m) for m in (name_stop, key_close, value_close, inv_close)) \
                and (key_lag or not _ends_key(s, key_open, key_close)):
            # upstream's streams take a marker in once something follows it
            s = s[:-1]
        while True:
            k = skip_ws(s, j)
            if calls and s.startswith(section_close, k):
                return calls, k + len(section_close)
            if s.startswith(inv_open, k) and (many or not calls):
                got = read_name(s, k + len(inv_open), name_stop, partial)
                if got in (UNDECIDED, INVALID):
                    if calls and partial and got == UNDECIDED:
                        return calls, None
                    return got if not calls else (calls, None if partial else k)
                name, v = got
                got = tagged_params(s, v, name, tools, key_open, key_close, value_close,
                                    inv_close, partial, value_open, lag, key_lag, key_end, raw)
                if got == UNDECIDED:
                    return UNDECIDED if not calls else (calls, None)
                if got == INVALID:
                    return INVALID if not calls else (calls, k)
                call, j = got
                calls.append(call)
                if j is None:
                    return calls, None
                continue
            tail = s[k:]
            if partial and (inv_open.startswith(tail) or (calls and section_close.startswith(tail))):
                return (calls, None) if calls else UNDECIDED
            if calls:
                # the section is not closed: the calls stand, the rest is text
                return calls, (None if not tail and not partial else k)
            return INVALID
    return block


def _ends_key(s: str, key_open: str, key_close: str) -> bool:
    """`s` ends with a key's close (`<parameter=city>`)."""
    k = s.rfind(key_open)
    return k >= 0 and s.endswith(key_close) and s.find(key_close, k + len(key_open)) == \
        len(s) - len(key_close)


def call_section(call_open: str, section_close: str, read_call, many: bool = True) -> Block:
    """A block of calls `(call_open CALL)+ section_close` (one call when not
    `many`), each read by `read_call(s, i, partial, tools)` from just after
    its opener: (call, the index after it or None while arriving),
    UNDECIDED or INVALID."""

    def block(s: str, j: int, partial: bool, tools: Tools):
        calls: list[ToolCall] = []
        while True:
            k = skip_ws(s, j)
            if calls and s.startswith(section_close, k):
                return calls, k + len(section_close)
            if s.startswith(call_open, k) and (many or not calls):
                got = read_call(s, k + len(call_open), partial, tools)
                if got in (UNDECIDED, INVALID):
                    return (calls, None if partial else k) if calls else got
                call, j = got
                calls.append(call)
                if j is None:
                    return calls, None
                continue
            tail = s[k:]
            if partial and (call_open.startswith(tail) or (calls and section_close.startswith(tail))):
                return (calls, None) if calls else UNDECIDED
            if calls:  # the section is not closed: the calls stand, the rest is text
                return calls, (None if not tail and not partial else k)
            return INVALID
    return block


def json_section(call_open: str, name_stop: str, call_close: str, section_close: str,
                 pre_name: str = "", many: bool = True,
                 name_of: Callable[[str], str] | None = None) -> Block:
    """A block of JSON-argument calls: `(call_open pre_name NAME name_stop
    {args} call_close)+ section_close`; `name_of` maps the written name to
    the function's (Kimi's `functions.NAME:0`), the written one then being
    the call's id."""

    def read_call(s: str, i: int, partial: bool, tools: Tools):
        got = read_name(s, i, name_stop, partial)
        if got in (UNDECIDED, INVALID):
            return got
        name, v = got
        got = json_call(name_of(name) if name_of else name, s, v, call_close, partial)
        if got == INVALID:
            return INVALID
        call, j = got
        if name_of:
            call = ToolCall(call.name, call.arguments, name, complete=call.complete)
        return call, j
    return call_section(call_open + pre_name, section_close, read_call, many)


def _id_of(s: str, start: int, end: int | None, key: str) -> str:
    if not key:
        return ""
    if end is None:  # an arriving call: its id once written in full (Command R's comes first)
        m = re.match(r'\{\s*' + re.escape(json.dumps(key)) + r'\s*:\s*("(?:[^"\\]|\\.)*")', s[start:])
        return json.loads(m.group(1)) if m else ""
    try:
        value = json.loads(s[start:end]).get(key, "")
    except (ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""


def json_list(close: str = "", name_key: str = "name", id_key: str = "id",
              bracket: bool = True) -> Block:
    """A JSON list of call objects (`[{"name": ..., "arguments": ...}, ...]`),
    then `close`; without `bracket`, one object or several separated by
    commas or blanks."""
    from ..jsonscan import scan_call

    def block(s: str, j: int, partial: bool, tools: Tools):
        k = skip_ws(s, j)
        if k >= len(s):
            return UNDECIDED if partial else INVALID
        if bracket:
            if s[k] != "[":
                return INVALID
            k = skip_ws(s, k + 1)
        calls: list[ToolCall] = []
        while True:
            if k >= len(s):
                return (calls, None) if calls else (UNDECIDED if partial else INVALID)
            if calls and (not bracket or s[k] == "]"):
                e = k + 1 if bracket else k
                c = skip_ws(s, e)
                if close and s.startswith(close, c):
                    return calls, c + len(close)
                if close and partial and close.startswith(s[c:]):
                    return calls, None
                if not bracket and s[k] != "{":
                    return calls, k
                if bracket:
                    return calls, e
            try:
                scan = scan_call(s, k, name_key)
            except Invalid:
                return (calls, k) if calls else INVALID
            if scan.name is None:
                if partial and scan.end is None:
                    return (calls, None) if calls else UNDECIDED
                return (calls, k) if calls else INVALID
            call = scanned_call(s, scan)
            calls.append(ToolCall(call.name, call.arguments, _id_of(s, k, scan.end, id_key),
                                  complete=call.complete))
            if scan.end is None:
                return calls, None
            k = skip_ws(s, scan.end)
            if k < len(s) and s[k] == ",":
                k = skip_ws(s, k + 1)
    return block


def json_list_grammar(head: str, name_key: str, args_key: str, tail: str,
                      extra: str = "") -> Callable:
    """Forced single call in a JSON-list dialect: the opener wrote
    `head[{"NAME_KEY": "` (or, named, up to the arguments)."""

    def grammar(tools, name, parallel) -> str:
        rules, alts = [], []
        for i, fn in enumerate(functions(tools, name)):
            rules.append(f"a{i}: " + schema_rule(fn))
            h = "" if name else lark(fn["name"] + f'", "{args_key}": ')
            alts.append(_seq(h, f"a{i}"))
        return ("start: call " + lark("}]" + tail) + "\ncall: " + " | ".join(alts) + "\n"
                + "\n".join(rules) + "\n")
    return grammar


def json_list_opener(head: str, name_key: str, args_key: str, extra: str = "") -> Callable:
    def opener(name: str | None) -> str:
        return head + "[{" + extra + json.dumps(name_key) + ": " + (
            json.dumps(name) + ", " + json.dumps(args_key) + ": " if name else '"')
    return opener


def scanned_call(s: str, scan):
    """A ToolCall from a jsonscan CallScan (a string argument decoded once complete)."""
    if scan.args_start is None:
        args = "{}" if scan.end is not None else "{"  # upstream's: the object opens at the name
    elif scan.args_end is None:
        args = s[scan.args_start:]
        if s[scan.args_start] == '"':
            args = ""  # a JSON-encoded string: decoded once complete
    else:
        raw = s[scan.args_start:scan.args_end]
        args = raw
        if raw.startswith('"'):
            args = json.loads(raw)
    return ToolCall(scan.name, args, complete=scan.end is not None)

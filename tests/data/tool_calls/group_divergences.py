"""Group the ids in known_divergences.txt by cause, as docs/chat.md counts them.

    PYTHONPATH=. python tests/data/tool_calls/group_divergences.py [--ids]

Each listed parse id goes in the first group (in this order) that any of
its differing cases fits: content after a call or a call to a tool not
offered (by the output's label), a held tail (upstream's partial content is
ours plus more), output upstream cannot read (it throws, or its partial is
empty), arguments while they arrive (the same content and thoughts, only
the calls differ), blanks and markers (equal once stripped, or upstream's
content stops short of ours), the rest.  Prints each group's count by
dialect; `--ids` also each id's group.
"""

from __future__ import annotations

import collections
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "unit" / "chat"))
import test_dialect_conformance as T  # noqa: E402
from mlxcel_trio.chat import dialects  # noqa: E402


def _cases(dialect: str, g: int, o: int):
    """(kind, partial, upstream's, ours) for each case that differs."""
    group = T._DATA[dialect]["groups"][g]
    setting, up = group["setting"], group["upstream"]
    extra = {"tools": T._DATA[dialect]["tools"] if setting["tools"] else None,
             "enable_thinking": setting["thinking"], "generation_prompt": up["generation_prompt"]}
    d, text = T._detected(group["template"]), group["outputs"][o]["text"]
    for out, length, partial, res in group["cases"]:
        if out != o:
            continue
        cut = text[:length]
        r = dialects.parse(d, cut, partial=bool(partial), reasoning=setting["reasoning"],
                           thinking_open=up["thinking_open"], **extra)
        expected, ours = group["results"][res], T._ours(r)
        if "error" in expected:
            soft = not r.tool_calls and (partial or (
                cut.endswith(r.content) and r.reasoning_content in cut
                and len(r.content) + len(r.reasoning_content) > 0))  # the test's soft failure
            if not soft:
                yield "error", partial, None, ours
            continue
        theirs = T._theirs(expected, ours)
        if theirs != ours:
            yield "diff", partial, theirs, ours


def _tail(k, p, th, us):
    return k == "diff" and p and th["reasoning_content"] == us["reasoning_content"] \
        and th["content"].startswith(us["content"]) and len(th["content"]) > len(us["content"])


def _unreadable(k, p, th, us):
    return k == "error" or (p and not (th["content"] or th["reasoning_content"] or th["tool_calls"]))


def _arriving(k, p, th, us):
    names = [c["name"] for c in th["tool_calls"]] if k == "diff" else None
    return k == "diff" and th["content"] == us["content"] \
        and th["reasoning_content"] == us["reasoning_content"] \
        and (names == [c["name"] for c in us["tool_calls"]]
             or p and abs(len(th["tool_calls"]) - len(us["tool_calls"])) == 1)


def _blanks(k, p, th, us):
    if k != "diff":
        return False

    def stripped(m):
        return m["content"].strip(), m["reasoning_content"].strip(), m["tool_calls"]
    return stripped(th) == stripped(us) or (
        th["reasoning_content"] == us["reasoning_content"] and th["tool_calls"] == us["tool_calls"]
        and us["content"].startswith(th["content"]) and len(us["content"]) > len(th["content"]))


GROUPS = (("content after a call / tool not offered", None), ("held tail", _tail),
          ("unreadable output", _unreadable), ("arriving arguments", _arriving),
          ("blanks and markers", _blanks), ("the rest", lambda *c: True))


def main() -> None:
    logging.disable(logging.CRITICAL)  # the soft failures' warnings
    counts = {name: collections.Counter() for name, _ in GROUPS}
    for param in T._params():
        test_id = f"test_parse_matches_upstream[{param.id}]"
        if test_id not in T.KNOWN:
            continue
        dialect, g, o = param.values
        label = T._DATA[dialect]["groups"][g]["outputs"][o]["label"]
        cases = list(_cases(dialect, g, o))
        for name, fits in GROUPS:
            if (label in ("call_then_content", "unknown_tool") if fits is None
                    else any(fits(*c) for c in cases)):
                counts[name][dialect] += 1
                if "--ids" in sys.argv:
                    print(f"{name}: {test_id}")
                break
    for name, by in counts.items():
        print(f"{name}: {sum(by.values())} ({', '.join(f'{d} {n}' for d, n in by.most_common())})")


if __name__ == "__main__":
    main()

"""The tool-call parser's cost per streamed token, per dialect.  A benchmark,
not a test: it prints numbers and never fails on them.

    python bench/tool_parse.py [--tokens-of 4] [--repeat 20] [--dialect NAME ...]

For each dialect of the conformance corpus (tests/data/tool_calls), its
first template's outputs with calls (one call, parallel calls, a code
argument) are fed to `ChatStream` in pieces of `--tokens-of` characters
(about one token of such text), as the server feeds decoded text, with the
request's tools, then once more with no tools offered (the dialect's own
reading with no call parsing: what a chat request without tools pays),
each through the Syntax the server builds (`dialects.syntax_for`).
Reported per dialect: microseconds per piece with tools and without, their
ratio, and the largest single update (the re-parse grows with the output,
so the last pieces cost most).  For scale: a decode step of the tiny
fixture takes milliseconds, the bench fixture's tens of milliseconds.

No model is loaded; the run takes under a minute with the defaults (bounded
by --repeat).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from mlxcel_trio.chat import dialects  # noqa: E402
from mlxcel_trio.chat.parser import ChatStream, Syntax  # noqa: E402

DATA = HERE.parent / "tests" / "data" / "tool_calls"
LABELS = ("call", "parallel", "code_call")


def feed(text: str, syntax: Syntax, step: int) -> tuple[float, float, int]:
    """(total seconds, largest update in seconds, pieces) for one stream."""
    stream = ChatStream(syntax)
    worst, pieces = 0.0, 0
    start = time.perf_counter()
    for i in range(0, len(text), step):
        t = time.perf_counter()
        stream.update(text[i:i + step])
        worst = max(worst, time.perf_counter() - t)
        pieces += 1
    stream.finish()
    return time.perf_counter() - start, worst, pieces


def measure(texts, syntax: Syntax, step: int, repeat: int) -> tuple[float, float]:
    """(median microseconds per piece over the runs, worst update in microseconds)."""
    per_piece, worst = [], 0.0
    for _ in range(repeat):
        total = pieces = 0
        for text in texts:
            t, w, n = feed(text, syntax, step)
            total, pieces, worst = total + t, pieces + n, max(worst, w)
        per_piece.append(total / pieces)
    return statistics.median(per_piece) * 1e6, worst * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens-of", type=int, default=4, help="characters per streamed piece")
    ap.add_argument("--repeat", type=int, default=20, help="runs per dialect (the median is kept)")
    ap.add_argument("--dialect", action="append", default=[], help="only these dialects")
    args = ap.parse_args()
    import logging
    logging.disable(logging.WARNING)  # malformed-call warnings are not the point here

    print("| dialect | template | µs/piece, tools | µs/piece, no tools | ratio | worst update µs |")
    print("|---|---|---|---|---|---|")
    for path in sorted(DATA.glob("*.json")):
        data = json.loads(path.read_text("utf-8"))
        if args.dialect and path.stem not in args.dialect:
            continue
        group = next(g for g in data["groups"] if g["setting"]["tools"])
        texts = [o["text"] for o in group["outputs"] if o["label"] in LABELS]
        if not texts:
            continue
        source = (DATA / "templates" / group["template"]).read_text("utf-8")
        d = dialects.detect(source)
        # as the server reads a request (dialects.syntax_for), with tools and without
        common = dict(reasoning_format="auto", thinking_open=group["upstream"]["thinking_open"],
                      generation_prompt=group["upstream"]["generation_prompt"])
        tools = dialects.syntax_for(d, tools=data["tools"], **common)
        plain = dialects.syntax_for(d, tools=None, **common)
        with_tools, worst = measure(texts, tools, args.tokens_of, args.repeat)
        without, _ = measure(texts, plain, args.tokens_of, args.repeat)
        print(f"| {path.stem} | {group['template']} | {with_tools:.1f} | {without:.1f} | "
              f"{with_tools / without:.2f}x | {worst:.0f} |")


if __name__ == "__main__":
    main()

"""StopMatcher: streaming stop strings equal the one-shot reference."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcel_trio.engine.stops import (
    StopMatcher,
    StopResult,
    apply_stops,
    partial_stop_len,
)


def run(pieces: list[str], stops: list[str]) -> tuple[list[str], str, bool]:
    """Feed pieces until a stop; returns (emits, word, stopped)."""
    m = StopMatcher(stops)
    emits: list[str] = []
    for piece in pieces:
        r = m.feed(piece)
        emits.append(r.emit)
        if r.stopped:
            assert r.word == m.word
            return emits, r.word, True
    emits.append(m.flush())
    return emits, m.word, m.stopped


def test_stop_across_pieces() -> None:
    m = StopMatcher(["</s>"])
    assert m.feed("Hello <") == StopResult("Hello ", False, "")
    assert m.feed("/") == StopResult("", False, "")
    assert m.held == "</"
    r = m.feed("s> tail")
    assert r == StopResult("", True, "</s>")
    assert m.feed("more") == StopResult("", True, "</s>")
    assert m.flush() == ""


def test_hold_back_then_release() -> None:
    m = StopMatcher(["STOP"])
    assert m.feed("a ST").emit == "a "
    assert m.feed("O").emit == ""
    assert m.feed("P!").emit == "" and m.stopped
    m = StopMatcher(["STOP"])
    assert m.feed("a ST").emit == "a "
    assert m.feed("OX").emit == "STOX"  # not a stop after all
    assert m.feed("S").emit == ""
    assert m.flush() == "S" and not m.stopped


def test_match_inside_single_piece_drops_rest() -> None:
    m = StopMatcher(["\n\n"])
    r = m.feed("line one\n\nline two")
    assert r == StopResult("line one", True, "\n\n")


def test_earliest_position_wins() -> None:
    assert apply_stops("xx B yy A", ["A", "B"]) == ("xx ", "B")
    assert run(["xx B yy A"], ["A", "B"]) == (["xx "], "B", True)
    # "abc" starts before "b": it wins, although "b" completes first.
    assert apply_stops("abc", ["b", "abc"]) == ("", "abc")
    assert run(["ab", "c"], ["b", "abc"]) == (["", ""], "abc", True)
    # ...and if "abc" never completes, "b" still stops at flush time.
    assert run(["ab"], ["b", "abc"]) == (["", "a"], "b", True)
    assert run(["ab", "x"], ["b", "abc"]) == (["", "a"], "b", True)


def test_tie_goes_to_first_in_list() -> None:
    assert apply_stops("--abc", ["abc", "ab"]) == ("--", "abc")
    assert apply_stops("--abc", ["ab", "abc"]) == ("--", "ab")
    assert run(["--a", "b", "c"], ["abc", "ab"]) == (["--", "", ""], "abc", True)
    assert run(["--a", "b", "c"], ["ab", "abc"]) == (["--", ""], "ab", True)
    assert run(["--a", "b", "d"], ["abc", "ab"]) == (["--", "", ""], "ab", True)


def test_overlapping_stops() -> None:
    for stops in (["abc", "bc"], ["bc", "abc"]):
        assert apply_stops("xabc", stops) == ("x", "abc")
        assert run(["xa", "b", "c"], stops) == (["x", "", ""], "abc", True)
    assert run(["xb", "c"], ["abc", "bc"]) == (["x", ""], "bc", True)
    assert run(["aab", "c"], ["abc", "bc"]) == (["a", ""], "abc", True)


def test_empty_strings_ignored() -> None:
    m = StopMatcher(["", "END", ""])
    assert m.stops == ("END",)
    assert m.feed("hello").emit == "hello"
    assert apply_stops("hello", [""]) == ("hello", "")
    assert partial_stop_len("abc", ["", "cd"]) == 1


def test_no_stops_pass_through() -> None:
    m = StopMatcher([])
    for piece in ["a", "", "<", "/s>"]:
        assert m.feed(piece) == StopResult(piece, False, "")
    assert m.flush() == "" and not m.stopped
    assert StopMatcher([""]).feed("x") == StopResult("x", False, "")


def test_empty_piece_and_unicode() -> None:
    m = StopMatcher(["。\n"])
    assert m.feed("").emit == ""
    assert m.feed("日本。").emit == "日本"
    assert m.feed("\n続き") == StopResult("", True, "。\n")


@pytest.mark.parametrize(
    ("text", "stops", "n"),
    [("hello <", ["</s>"], 1), ("hello </", ["</s>"], 2), ("hello", ["</s>"], 0),
     ("aaa", ["aab"], 2), ("ab", ["abc", "b"], 2), ("xab", ["b", "abc"], 2),
     ("</s>", ["</s>"], 0), ("", ["x"], 0)],
)
def test_partial_stop_len(text: str, stops: list[str], n: int) -> None:
    assert partial_stop_len(text, stops) == n


ALPHABET = "ab c\n"


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    # keep some empty pieces too: they must be harmless
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


@settings(max_examples=1500, deadline=None)
@given(
    text=st.text(ALPHABET, max_size=40),
    stops=st.lists(st.text(ALPHABET, max_size=5), max_size=4),
    cuts=st.lists(st.integers(0, 100), max_size=12),
)
def test_streaming_equals_reference(text: str, stops: list[str], cuts: list[int]) -> None:
    content, word = apply_stops(text, stops)
    emits, got_word, stopped = run(_split(text, cuts), stops)
    assert "".join(emits) == content
    assert got_word == word and stopped == bool(word)
    # One character at a time must agree too.
    emits, got_word, _ = run(list(text), stops)
    assert "".join(emits) == content and got_word == word


@settings(max_examples=500, deadline=None)
@given(
    text=st.text(ALPHABET, max_size=40),
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=5), min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 100), max_size=12),
)
def test_held_text_is_bounded_and_prefix_safe(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    m = StopMatcher(stops)
    sent = ""
    content, _ = apply_stops(text, stops)
    for piece in _split(text, cuts):
        r = m.feed(piece)
        sent += r.emit
        assert content.startswith(sent)  # never sends text a stop later removes
        assert len(m.held) < max(map(len, stops))
        if r.stopped:
            break

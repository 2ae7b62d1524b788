"""Value domains and upstream's two boolean vocabularies."""

from __future__ import annotations

import pytest

from mlxcel_trio.cli.values import (
    BadValue,
    CsvList,
    Float,
    Int,
    Seed,
    Text,
    is_truthy,
    parse_bool,
)


@pytest.mark.parametrize("text", ["on", "enabled", "true", "1"])
def test_truthy_spellings(text: str) -> None:
    assert is_truthy(text)


@pytest.mark.parametrize("text", ["", "0", "off", "yes", "TRUE", "On", "True", " 1", "2"])
def test_everything_else_is_not_truthy(text: str) -> None:
    assert not is_truthy(text)


@pytest.mark.parametrize(
    ("text", "value"),
    [("true", True), ("1", True), ("on", True), ("enabled", True),
     ("false", False), ("0", False), ("off", False), ("disabled", False)],
)
def test_parse_bool_vocabulary(text: str, value: bool) -> None:
    assert parse_bool(text) is value


@pytest.mark.parametrize("text", ["", "yes", "no", "TRUE", "False", "2", "sometimes"])
def test_parse_bool_refuses_the_rest(text: str) -> None:
    with pytest.raises(BadValue):
        parse_bool(text)


def test_int_range_and_sentinels() -> None:
    dom = Int(1, 10, sentinels=(-1,))
    assert dom.parse("1") == 1 and dom.parse("10") == 10 and dom.parse("-1") == -1
    assert dom.parse(" 7 ") == 7
    for bad in ("0", "-2", "11", "abc", "1.5", "", "1_0", "0x10"):
        with pytest.raises(BadValue):
            dom.parse(bad)
    assert dom.domain == "-1 or an integer in [1, 10]"


def test_float_is_finite() -> None:
    dom = Float()
    assert dom.parse("0.5") == 0.5 and dom.parse("-1") == -1.0
    for bad in ("nan", "inf", "-inf", "x", "", "1_0"):
        with pytest.raises(BadValue):
            dom.parse(bad)
    bounded = Float(0.0, 1.0)
    with pytest.raises(BadValue):
        bounded.parse("1.5")
    assert bounded.domain == "a number in [0, 1]"


@pytest.mark.parametrize(
    ("text", "value"),
    [("-1", 4294967295), ("4294967295", 4294967295), ("-2", 4294967294),
     ("0", 0), ("42", 42), ("4294967296", 0)],
)
def test_seed_folds_into_uint32(text: str, value: int) -> None:
    assert Seed().parse(text) == value


def test_seed_refuses_non_integers() -> None:
    with pytest.raises(BadValue):
        Seed().parse("random")


def test_csv_list_keeps_items_verbatim_and_drops_empty_ones() -> None:
    assert CsvList().parse("b,a") == ("b", "a")
    assert CsvList().parse("k1,,k2,") == ("k1", "k2")
    assert CsvList().parse(" x") == (" x",)
    with pytest.raises(BadValue):
        CsvList().parse(",")


def test_text_refuses_empty() -> None:
    assert Text().parse("x") == "x"
    with pytest.raises(BadValue):
        Text().parse("")

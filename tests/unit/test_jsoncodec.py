"""Strict JSON in and out: what the API reads from clients and writes back."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from agent_server.model import jsoncodec

DOCUMENT = {"text": "h\u00e9llo \u2603", "n": [1, 2.5, None, True]}


@pytest.mark.parametrize(
    "encoding", ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le"]
)
def test_bodies_in_every_encoding_json_allows_decode_alike(encoding: str) -> None:
    raw = json.dumps(DOCUMENT, ensure_ascii=False).encode(encoding)
    assert jsoncodec.loads(raw) == DOCUMENT


def test_encoding_shortcut_agrees_with_the_standard_library() -> None:
    """Every body of up to four bytes drawn from the bytes that decide an encoding."""
    alphabet = [0x00, 0x01, 0x20, 0x7B, 0x7F, 0x80, 0xBB, 0xBF, 0xEF, 0xFE, 0xFF]
    for length in range(1, 5):
        for combination in itertools.product(alphabet, repeat=length):
            raw = bytes(combination)
            assert jsoncodec._encoding(raw) == json.detect_encoding(raw), raw


@pytest.mark.parametrize("raw", [b"NaN", b"[Infinity]", b'{"x": -Infinity}', b"1e400"])
def test_non_finite_numbers_are_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):
        jsoncodec.loads(raw)


def test_big_integers_stay_exact_and_odd_text_is_written() -> None:
    big = 2**80 + 1
    assert jsoncodec.loads(str(big).encode()) == big
    assert json.loads(jsoncodec.dumps({"n": big, "s": "\ud800"})) == {"n": big, "s": "\ud800"}


def _nested(levels: int) -> object:
    """`levels` containers, one inside the other, lists and objects in turn."""
    value: object = "leaf"
    for level in range(levels):
        value = {"k": value} if level % 2 else [value]
    return value


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (math.nan, "JSON cannot carry"),
        ([1.0, math.inf], "JSON cannot carry"),
        ({"a": {"b": (-math.inf,)}}, "JSON cannot carry"),
        (-(10**4301), "digits"),
        ({"deep": [7 * 10**4400]}, "digits"),
        (_nested(jsoncodec.MAX_DEPTH + 1), "nested deeper"),
        (_nested(5000), "nested deeper"),  # far past the recursion limit: no RecursionError
    ],
    ids=["nan", "inf", "-inf", "big-int", "nested-big-int", "deep", "very-deep"],
)
def test_check_refuses_what_cannot_be_written_and_read_back(value: object, why: str) -> None:
    with pytest.raises(jsoncodec.Unrecordable, match=why):
        jsoncodec.check(value, "it")


@pytest.mark.parametrize(
    "value",
    [10**4299, -(2**200), _nested(jsoncodec.MAX_DEPTH - 1), {"s": "\ud800"}, None],
    ids=["4299-digits", "big", "deep", "surrogate", "null"],
)
def test_what_check_accepts_reads_back_the_same(value: object) -> None:
    jsoncodec.check(value)
    assert jsoncodec.loads(jsoncodec.dumps(value)) == value


@pytest.mark.parametrize(
    ("one", "other", "same"),
    [
        ({"a": 1, "b": {"c": [1, None]}}, {"b": {"c": [1, None]}, "a": 1}, True),
        ({"big": 2**200, "z": 1}, {"z": 1, "big": 2**200}, True),  # past orjson's integers
        ({"a": 1}, {"a": 1.0}, False),
        ({"a": 1}, {"a": True}, False),
        ([1, 2], [2, 1], False),
        ("é", "\u00e9", True),
    ],
    ids=["key-order", "big-int", "int-float", "int-bool", "list-order", "escape"],
)
def test_canonical_is_equal_exactly_for_the_same_json_data(
    one: object, other: object, same: bool
) -> None:
    """An answer retried is the same answer when its JSON data is (section: input)."""
    assert (jsoncodec.canonical(one) == jsoncodec.canonical(other)) is same

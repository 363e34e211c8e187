"""Strict JSON both ways: what the API reads from clients and writes back to them.

Strict means RFC 8259: no `NaN` or `Infinity` in, none out, no number that only fits a float
as infinity (`1e400`); results, checkpoints, events and bodies are checked with `check`, so
what cannot be written and read back the same is refused where it enters. Output is UTF-8
from orjson (cheaper per response, bench/RESULTS.md); what orjson refuses (a
lone surrogate a client sent, a valid JSON escape that UTF-8 cannot encode; an integer
beyond 64 bits) goes out through the standard library, escaped to ASCII, never as a 500.
Input stays with the standard library's parser, which keeps big integers exact and accepts
those escapes; one decoder serves every request (`json.loads` with options builds a new one
per call).
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import orjson

_ENCODER = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def dumps(value: Any) -> bytes:
    """Compact JSON; TypeError for what is not JSON data."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return _ENCODER.encode(value).encode("ascii")


def canonical(value: Any) -> bytes:
    """`value` as JSON with its objects' keys sorted: two values are the same JSON data
    exactly when these are equal (an answer retried with its keys in another order is the
    same answer; `1`, `1.0` and `true` stay three)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        encoder = json.JSONEncoder(
            ensure_ascii=True, allow_nan=False, separators=(",", ":"), sort_keys=True
        )
        return encoder.encode(value).encode("ascii")


#: Nesting this codec writes and reads back: orjson writes at most 254 levels, and the
#: standard library's parser recurses once per level.
MAX_DEPTH = 200
#: Digits of an integer the parser reads back (Python's own limit on int <-> str).
MAX_INT_DIGITS = sys.get_int_max_str_digits() or 4300


class Unrecordable(ValueError):
    """A value this codec cannot write and read back the same: an execution that produced
    it fails (its result, checkpoint or event), a request that sent it is a 400."""


def check(value: Any, what: str = "value") -> None:
    """The one place that decides whether JSON data can be recorded: raises Unrecordable
    for NaN or an infinity (orjson would write null), an integer past MAX_INT_DIGITS (the
    parser would refuse it when read back) or nesting deeper than MAX_DEPTH. It runs on
    every body and result, so the usual value is walked by a plain recursion (bounded by
    MAX_DEPTH); only a value it finds wrong is walked again to say why."""
    try:
        if _fine(value, 1):
            return
    except RecursionError:  # called from deep in a stack of its own: walk iteratively
        pass
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                raise Unrecordable(f"{what} holds {item!r}, which JSON cannot carry")
        elif isinstance(item, int) and not isinstance(item, bool):
            if abs(item) >= _TOO_MANY_DIGITS:
                raise Unrecordable(f"{what} holds an integer of more than {MAX_INT_DIGITS} digits")
        elif isinstance(item, dict | list | tuple):
            if depth > MAX_DEPTH:
                raise Unrecordable(f"{what} is nested deeper than {MAX_DEPTH} levels")
            if isinstance(item, dict):
                pending.extend((child, depth + 1) for child in item.values())
            else:
                pending.extend((child, depth + 1) for child in item)


def _fine(value: Any, depth: int) -> bool:
    """Whether `check` would pass `value` (exact types first: they are most of it)."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        number: int = value
        return -_TOO_MANY_DIGITS < number < _TOO_MANY_DIGITS
    if kind is float:
        real: float = value
        return real - real == 0.0  # false for NaN and the infinities
    if kind is dict or kind is list or kind is tuple or isinstance(value, dict | list | tuple):
        if depth > MAX_DEPTH:
            return False
        depth += 1
        for child in value.values() if isinstance(value, dict) else value:
            if not _fine(child, depth):
                return False
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, int):
        return bool(abs(value) < _TOO_MANY_DIGITS)
    return True  # not JSON data at all: the encoder says so


#: The smallest integer with more than MAX_INT_DIGITS digits.
_TOO_MANY_DIGITS: int = 10**MAX_INT_DIGITS


def dumps_recordable(value: Any, what: str = "value") -> bytes:
    """`dumps` of a value that must read back the same (a checkpoint, an event): checked
    first; Unrecordable otherwise (what is not JSON data at all included)."""
    check(value, what)
    try:
        return dumps(value)
    except (TypeError, ValueError) as exc:
        raise Unrecordable(f"{what} is not JSON data: {short_error(exc)}") from None


def loads(raw: bytes) -> Any:
    """Decode a body (UTF-8, or UTF-16/32 as `json.loads` detects them); ValueError when it
    is not strict JSON."""
    text = raw.decode(_encoding(raw), "surrogatepass")
    return _DECODER.decode(text)


def _encoding(raw: bytes) -> str:
    """`json.detect_encoding`, answered at once for the usual body: two ASCII bytes, neither
    zero, cannot begin a byte order mark or UTF-16/32 text, so the body is UTF-8."""
    head = raw[:2]
    if head and head.isascii() and 0 not in head:
        return "utf-8"
    return json.detect_encoding(raw)


def short_error(exc: BaseException, limit: int = 200) -> str:
    """An exception's message cut to `limit` characters: it is echoed to the client."""
    text = str(exc) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def _refuse_constant(name: str) -> Any:
    """NaN and Infinity are not JSON (RFC 8259), though Python's parser accepts them."""
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    """A number too large for a float (1e999) would silently become infinity."""
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"number out of range: {short_error(ValueError(text))}")
    return number


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)

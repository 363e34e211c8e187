"""Strict JSON both ways: what the API reads from clients and writes back to them.

Strict means RFC 8259: no `NaN` or `Infinity` in, none out (results are checked with
`check_finite` when they are recorded), no number that only fits a float as infinity
(`1e400`). Output is UTF-8 from orjson, a fifth of the standard library's cost per response;
what orjson refuses (a lone surrogate a client sent, a valid JSON escape that UTF-8 cannot
encode; an integer beyond 64 bits) goes out through the standard library, escaped to ASCII,
never as a 500. Input stays with the standard library's parser, which keeps big integers
exact and accepts those escapes; one decoder serves every request (`json.loads` with options
builds a new one per call).
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

_ENCODER = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def dumps(value: Any) -> bytes:
    """Compact JSON; TypeError for what is not JSON data."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return _ENCODER.encode(value).encode("ascii")


def check_finite(value: Any) -> None:
    """ValueError when JSON data holds NaN or an infinity, which no JSON document can carry
    (orjson would write them as null)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError(f"{item!r} is not JSON compliant")
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)


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

"""Checking an answer against its request's JSON schema: one validation on every replica.

Whichever replica an answer reaches, it is checked the same way (section 13): against the
request's JSON schema, with JSON's own types (`"true"` is not a boolean anywhere), before
the owner's type reads it in `ctx.ask`. A string is valid Unicode and an integer one `int`
reads (an integral float below 2**63), as pydantic then reads them: an answer taken here
is never one the owner's type refuses for its JSON types. The check must not stall the
replica: Python's `re`
(which `jsonschema` uses for `pattern`) backtracks, exponentially on patterns such as an
ordinary e-mail pattern, and holds the GIL meanwhile, so no thread could save the event
loop from it. Every regular expression of a schema is matched here by RE2 instead (linear
in the text), and the whole check runs in a worker thread, bounded in time.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Iterator
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import re2  # type: ignore[import-untyped]

#: Schema errors reported at most.
MAX_ERRORS = 20
#: Characters of an error's message (it may quote the value).
MAX_MESSAGE = 300
#: Seconds a check may take; past it the answer is refused (linear matching keeps any
#: answer the body limit lets in far below it).
CHECK_SECONDS = 10.0

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a pattern RE2 cannot read is said once, by the check


class TooSlow(Exception):
    """The check did not finish within CHECK_SECONDS."""


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> Any:
    """The pattern under RE2, or None when RE2 cannot read it (a look-around, a
    back-reference): such a pattern refuses nothing here, the owner's type still reads the
    answer."""
    try:
        return re2.compile(pattern, options=_OPTIONS)
    except Exception:
        return None


def _search(pattern: str, text: str) -> bool:
    """Whether `text` matches; a text no pattern can read (a lone surrogate: RE2 takes
    UTF-8) matches none."""
    compiled = _compiled(pattern)
    if compiled is None:
        return True
    try:
        return compiled.search(text) is not None
    except UnicodeError:
        return False


def _unicode(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


#: The owner's `int` reads an integral float only below this magnitude.
_INT_FROM_FLOAT = 2.0**63


def _is_string(checker: Any, instance: Any) -> bool:
    """A string the owner's `str` reads: valid Unicode (JSON's escapes can spell a lone
    surrogate, which pydantic refuses)."""
    return isinstance(instance, str) and _unicode(instance)


def _is_integer(checker: Any, instance: Any) -> bool:
    """An integer as the owner's `int` reads one: any int, or an integral float within
    what it converts (JSON Schema alone takes 1e19, which pydantic refuses)."""
    if isinstance(instance, bool):
        return False
    if isinstance(instance, int):
        return True
    return (
        isinstance(instance, float)
        and instance.is_integer()
        and -_INT_FROM_FLOAT < instance < _INT_FROM_FLOAT
    )


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


# The keywords of `jsonschema` that match regular expressions, with RE2.


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield jsonschema.ValidationError(_short(f"{instance!r} does not match {pattern!r}"))


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: Any
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for name, value in instance.items():
            if _search(pattern, name):
                yield from validator.descend(value, subschema, path=name, schema_path=pattern)


def _additional_properties(
    validator: Any, allowed: Any, instance: Any, schema: Any
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    known = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [
        name
        for name in instance
        if name not in known and not any(_search(pattern, name) for pattern in patterns)
    ]
    if validator.is_type(allowed, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], allowed, path=extra)
    elif not allowed and extras:
        named = ", ".join(repr(extra) for extra in sorted(extras)[:10])
        yield jsonschema.ValidationError(
            _short(f"additional properties are not allowed ({named} unexpected)")
        )


_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
    },
    # JSON's types as the owner's type then reads them: what passes here, it reads.
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine_many(
        {"string": _is_string, "integer": _is_integer}
    ),
)


def schema_errors(schema: dict[str, Any], value: Any) -> list[dict[str, Any]]:
    """Why `value` does not fit `schema`, in the shape of pydantic's error list (at most
    MAX_ERRORS); empty when it fits. A schema the validator cannot read refuses nothing:
    the owner's own type still reads the answer."""
    try:
        validator = _Validator(schema)
        found = list(itertools.islice(validator.iter_errors(value), MAX_ERRORS))
    except Exception:  # a schema it cannot read or resolve: SchemaError, Unresolvable, ...
        return []
    found.sort(key=lambda error: [str(part) for part in error.absolute_path])
    return [
        {
            "type": f"schema_{error.validator}",
            "loc": ["body", "value", *error.absolute_path],
            "msg": _short(str(error.message)),
        }
        for error in found
    ]


async def check(schema: dict[str, Any], value: Any) -> list[dict[str, Any]]:
    """`schema_errors` in a worker thread, within CHECK_SECONDS (TooSlow past it): the
    event loop goes on serving meanwhile."""
    work = asyncio.to_thread(schema_errors, schema, value)
    try:
        return await asyncio.wait_for(work, CHECK_SECONDS)
    except TimeoutError:
        raise TooSlow(
            f"the answer could not be checked against its schema in {CHECK_SECONDS:g} s"
        ) from None

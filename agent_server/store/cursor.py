"""List cursors: the one reader both stores and the list route share.

A cursor is `<created_at>:<execution_id>`, the creation time and id of the last record a page
looked at, as the store wrote it (Redis writes the index score as a double; memory writes
Python's repr; for a time of this era both are plain digits with a fraction). Anything a
page could not have given is refused here, before a store sees it: Redis refuses a score it
cannot parse (`1.2.3`) with an error, and `inf` or `9e999` would be taken as a time no record
has. The pattern is the whole rule, so the OpenAPI document states it exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Seconds since 1970 in at most 11 digits (before the year 5138), an optional fraction (no
#: sign, exponent, `inf`, `nan` or hex), then the id. ECMA-262 syntax too, for OpenAPI.
CURSOR_PATTERN = r"^[0-9]{1,11}(\.[0-9]{1,20})?:[0-9a-f]{32}$"
_FORM = re.compile(CURSOR_PATTERN.removeprefix("^").removesuffix("$"))
#: What a refusal says.
CURSOR_RULE = "cursor is not one a Link header of this list gave"


class BadCursor(ValueError):
    """A list cursor no page gave (or one of another store)."""


@dataclass(frozen=True, slots=True)
class ListCursor:
    """A checked cursor: `score` is the time as the cursor spelled it (the Redis list script
    compares it to the index's own text for ties), `created_at` its value."""

    score: str
    created_at: float
    execution_id: str

    @classmethod
    def read(cls, text: str) -> ListCursor:
        """The cursor `text` names, or BadCursor for anything CURSOR_PATTERN does not take."""
        if _FORM.fullmatch(text) is None:
            raise BadCursor(text)
        score, _, execution_id = text.partition(":")
        return cls(score, float(score), execution_id)

    def __str__(self) -> str:
        return f"{self.score}:{self.execution_id}"

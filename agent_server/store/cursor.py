"""List cursors: the one reader both stores and the list route share.

A cursor is `<created_at>:<execution_id>`, the creation time and id of the last record a page
looked at, as the store wrote it (Redis writes the index score as a double; memory writes
Python's repr). Anything a page could not have given is refused here, before a store sees
it: Redis refuses a score it cannot parse (`1.2.3`) with an error, and `inf` or `9e999`
would be taken as a time no record has.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

#: The first second no record's time can show (`created_at` is an ISO date of 4 digits).
YEAR_10000 = 253_402_300_800.0
#: Digits, an optional fraction and exponent (no sign, no `inf`/`nan`, no hex), then the id
#: (ECMA-262 syntax too, for the OpenAPI document).
CURSOR_PATTERN = r"^[0-9]{1,20}(\.[0-9]{1,20})?([eE][+-]?[0-9]{1,3})?:[0-9a-f]{32}$"
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
        """The cursor `text` names, or BadCursor: a time that is not a finite number from 0
        to before YEAR_10000, or an id that is not 32 lower-case hex digits."""
        if _FORM.fullmatch(text) is None:
            raise BadCursor(text)
        score, _, execution_id = text.partition(":")
        created_at = float(score)
        if not math.isfinite(created_at) or created_at >= YEAR_10000:
            raise BadCursor(text)
        return cls(score, created_at, execution_id)

    def __str__(self) -> str:
        return f"{self.score}:{self.execution_id}"

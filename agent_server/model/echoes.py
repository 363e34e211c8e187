"""What an error says back of what a caller sent, on every front (the API, A2A, MCP, the
schedules): a bounded prefix of the value, never the value whole (an id of a megabyte must not
come back as one), and the names it could have been, a bounded list of them.

Every refusal that echoes a caller's value (an id, a name, an enumeration's value) goes
through `shown`; every one that names the allowed values through `one_of`.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterable

#: How much of a value a refusal echoes (characters of its repr): a huge or unprintable
#: value sent must not come back whole.
SHOWN_LENGTH = 64
#: How many allowed names a refusal lists before saying how many more there are.
MAX_NAMED = 20


def shown(value: object) -> str:
    """A value a client sent, as a refusal echoes it: its repr (any character escaped),
    cut to about SHOWN_LENGTH characters."""
    cut = reprlib.Repr()
    cut.maxstring = cut.maxother = cut.maxlong = SHOWN_LENGTH
    try:
        return cut.repr(value)
    except ValueError:  # an integer past Python's digits limit for str()
        return f"<{type(value).__name__} too long to show>"


def one_of(names: Iterable[str], limit: int = MAX_NAMED) -> str:
    """The allowed names, sorted and comma-separated: at most `limit` of them, then "and K
    more" (an agent may serve hundreds of reasoners). "none" when there are none."""
    ordered = sorted(names)
    if not ordered:
        return "none"
    listed = ", ".join(ordered[:limit])
    rest = len(ordered) - limit
    return f"{listed} and {rest} more" if rest > 0 else listed

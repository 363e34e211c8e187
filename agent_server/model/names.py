"""The names the routes carry in a path: reasoner names and session ids.

A name that a URL path segment cannot carry as it is (a '/', a '%', a space, non-ASCII, a
dot segment that clients resolve away) would be stored but unreachable: a reasoner that can
never run, a session that can never be released. Both are refused where they enter: a
reasoner name at registration, a session id with 400 wherever a request gives one.
"""

from __future__ import annotations

import re

#: Letters, digits, '_', '.' and '-', beginning with a letter, a digit or '_', at most 128.
REASONER_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"
REASONER_NAME_RULE = (
    "a reasoner name is 1 to 128 of the characters A-Z a-z 0-9 _ . - and begins with a "
    "letter, a digit or '_'"
)
#: 1 to 256 characters a path segment carries without percent-encoding (RFC 3986 `pchar`),
#: other than the dot segments '.' and '..'. ECMA-262 syntax, for the OpenAPI document.
SESSION_ID_PATTERN = r"^(?!\.\.?$)[A-Za-z0-9._~!$&'()*+,;=:@-]{1,256}$"
SESSION_ID_RULE = (
    "a session id is 1 to 256 of the characters A-Z a-z 0-9 - . _ ~ ! $ & ' ( ) * + , ; = : @"
    ", and not '.' or '..'"
)

#: A schedule's id: an execution id (one made at run time), or a reasoner's name, '-' and
#: its place in the reasoner's list (a declared one: app/schedules.py `declared_id`).
SCHEDULE_ID_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,159}$"
SCHEDULE_ID_RULE = (
    "a schedule id is 1 to 160 of the characters A-Z a-z 0-9 _ . - and begins with a "
    "letter, a digit or '_'"
)


def _whole(pattern: str) -> str:
    """The pattern for Python's `match`, where `$` would also match before a final newline."""
    return pattern.removesuffix("$").replace("$)", r"\Z)") + r"\Z"


_REASONER_NAME = re.compile(_whole(REASONER_NAME_PATTERN))
_SESSION_ID = re.compile(_whole(SESSION_ID_PATTERN))
_SCHEDULE_ID = re.compile(_whole(SCHEDULE_ID_PATTERN))
_SESSION_ID_BYTES = re.compile(_whole(SESSION_ID_PATTERN).encode())


def is_reasoner_name(name: str) -> bool:
    return _REASONER_NAME.match(name) is not None


def is_schedule_id(value: str) -> bool:
    return _SCHEDULE_ID.match(value) is not None


def is_session_id(value: str) -> bool:
    return _SESSION_ID.match(value) is not None


def is_session_id_bytes(raw: bytes) -> bool:
    """The header's raw value, checked without decoding it first."""
    return _SESSION_ID_BYTES.match(raw) is not None


#: Between a tenant and a name in a scoped name: no tenant holds it (identity/principal.py refuses
#: control characters), so a scoped name is one tenant's, whatever the name holds.
TENANT_SEPARATOR = "\x1f"


def scoped(tenant: str | None, name: str) -> str:
    """A name a client chose (a session id, an `Idempotency-Key`, a concurrency key's
    value) as its tenant's: the one function that makes such a name a store's key, so two
    tenants using the same name never meet (docs/security.md#names-are-per-tenant). A server
    without authentication has no tenant: its names are as given."""
    return name if tenant is None else f"{tenant}{TENANT_SEPARATOR}{name}"

"""A refusal every front maps to its own error: REST a status, A2A and MCP a JSON-RPC error.

The application layer says why (`Why`) and what to tell the caller (`detail`); a front
decides how. One enumeration, so a front that lacks a mapping for a reason fails at import
(http/routing.py `REFUSAL_STATUS`), not on a request.
"""

from __future__ import annotations

import enum
from typing import Any


class Why(enum.Enum):
    """Why a use case refused: what the caller can do about it differs for each."""

    #: The request itself is wrong (a bad header, a body that does not fit).
    INVALID = "invalid"
    #: The request is well formed, but its content cannot be taken (an answer off schema).
    UNPROCESSABLE = "unprocessable"
    #: No such thing for this caller (unknown, or another tenant's: the same answer).
    UNKNOWN = "unknown"
    #: `@agent.authorize` refused the action.
    DENIED = "denied"
    #: The execution's state forbids it now (answered already, waiting for no input).
    CONFLICT = "conflict"
    #: A start's idempotency key (A2A: its message id) was first used for another request.
    KEY_MISMATCH = "key_mismatch"
    #: A start's idempotency key names an execution forgotten since (deleted, expired).
    KEY_FORGOTTEN = "key_forgotten"
    #: The session has an execution that is not terminal, and the policy is `reject`.
    SESSION_BUSY = "session_busy"
    #: The session is being released: it takes no new work.
    SESSION_RELEASING = "session_releasing"
    #: Too large to keep (an answer over `--max-answer-bytes`).
    TOO_LARGE = "too_large"
    #: Every slot is taken: retry later.
    BUSY = "busy"
    #: The store did not answer: retry later (the start may have been recorded).
    UNAVAILABLE = "unavailable"
    #: The store ran it but cannot yet say it holds: read the execution later.
    IN_DOUBT = "in_doubt"
    #: This replica is shutting down: retry elsewhere.
    SHUTTING_DOWN = "shutting_down"


class Refusal(Exception):
    """A use case refused: why, what to tell the caller, and the execution it is about
    (an in-doubt start's, a busy session's), if any."""

    def __init__(self, why: Why, detail: Any, *, execution_id: str | None = None) -> None:
        super().__init__(detail if isinstance(detail, str) else repr(detail))
        self.why = why
        self.detail = detail
        self.execution_id = execution_id


#: What an in-doubt write is told, on every front (`Why.IN_DOUBT`).
IN_DOUBT_DETAIL = (
    "the store took this, but no Redis replica holds it yet (a failover could lose it): "
    "read the execution at Location later"
)


class Denied(Refusal):
    """`@agent.authorize` refused `action`."""

    def __init__(self, action: str) -> None:
        super().__init__(Why.DENIED, f"not allowed to {action}")
        self.action = action

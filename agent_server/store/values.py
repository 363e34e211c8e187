"""What the store's roles (roles.py) take and give besides records: an idempotency key, a
page of a list, a webhook delivery owed, and the handlers through which the store reaches
this replica's registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent_server.model.execution import CancelReason, Execution

#: How many of its own leases a replica renews, once its renewals began again after a gap (an
#: outage of the store stopped everyone's), before it judges an owner whose lease lapsed
#: before that gap ended: a store outage is nobody's death, whoever reconnects first. An
#: owner that lapses while the judge renews is judged after one lease, as always.
OUTAGE_LEASES = 2

#: How a cancel request reaches the registry of the execution's owner: the id, why, and
#: the seconds it may take to settle before it is abandoned (None: no bound).
CancelHandler = Callable[[str, CancelReason, float | None], object]
#: Told when a queued execution leaves the queue: taken (with the seconds it waited past
#: its due time) or cancelled (None).
UnqueuedHandler = Callable[[Execution, "float | None"], None]
#: How an answer the store took reaches the `ctx.ask` waiting on the execution's owner: the
#: id, the request id (None: the pending one) and the value; False when nothing waits.
AnswerHandler = Callable[[str, int | None, Any], bool]


@dataclass(frozen=True)
class Idempotency:
    """An `Idempotency-Key` and what it was first used for: a repeat of the same request
    gets the same execution; the same key for another request is refused."""

    key: str
    fingerprint: str
    ttl: float


@dataclass(frozen=True)
class Page:
    """One page of a list, newest first. `cursors[i]` continues after `executions[i]` (a
    caller that shows fewer goes on from the last it showed); `next` continues after the
    last record the store looked at, None when there is nothing older to look at."""

    executions: list[Execution]
    cursors: list[str]
    next: str | None


@dataclass
class Delivery:
    """A webhook delivery owed (docs/webhooks.md): recorded by the store with the move it
    reports, and claimed by a replica for one attempt at a time."""

    #: The `webhook-id`: the same on every attempt (receivers deduplicate by it).
    delivery_id: str
    #: `execution.finished` or `execution.input_required`.
    type: str
    url: str
    #: When the move happened (Unix seconds on the store's clock): the body's `timestamp`.
    at: float
    #: Seconds since then, on the store's clock, when it was claimed.
    age: float
    #: Attempts made before this one.
    attempts: int
    #: The execution's JSON as the move left it.
    data: dict[str, Any]
    #: The trace context its record keeps (`Execution.trace`), None when started with
    #: traces off; with `attempt`, the one whose move it reports, it names the span a
    #: receiver's `traceparent` continues (tracing.webhook_headers).
    trace: str | None = None
    attempt: int = 0


#: The `type` of a delivery at an end and at a request for input.
FINISHED_EVENT = "execution.finished"
INPUT_REQUIRED_EVENT = "execution.input_required"

"""When to try a call again, and for how long: the budget both fronts spend the same way."""

from __future__ import annotations

import email.utils
import time

import httpx

from agent_server.client.models import is_execution, response_body
from agent_server.model.counts import counted

#: Backoff after a connection or gateway error: doubled from the first up to the last.
BACKOFF_FIRST = 0.1
BACKOFF_MAX = 2.0
#: The longest Retry-After honoured as given; a longer one is cut to this.
RETRY_AFTER_MAX = 10.0
#: Transport errors raised before the request left: a retry can never repeat anything.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), RETRY_AFTER_MAX)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return min(max(0.0, when.timestamp() - time.time()), RETRY_AFTER_MAX)


def refusal(response: httpx.Response) -> bool:
    """A 429, 502, 503 or 504 that did no work: no execution in its body, and no
    `Location` of one to follow."""
    if response.status_code not in (429, 502, 503, 504) or followed(response):
        return False
    return not is_execution(response_body(response))


def followed(response: httpx.Response) -> str | None:
    """The execution a 503 + `Location` points to: a synchronous run whose end is to be
    read there (handed off at shutdown, or not yet recorded in the shared store)."""
    location = response.headers.get("location")
    if response.status_code != 503 or not location:
        return None
    return location.rstrip("/").rsplit("/", 1)[-1] or None


def in_doubt(response: httpx.Response) -> str | None:
    """The execution of a write answered in doubt (503 + `Location`, `"in_doubt": true`):
    taken by the server, on no Redis replica yet. A retry of the same write (its
    `Idempotency-Key`, its `request_id`) settles it once a replica holds it."""
    if followed(response) is None:
        return None
    body = response_body(response)
    if not isinstance(body, dict) or body.get("in_doubt") is not True:
        return None
    execution_id = body.get("execution_id")
    return execution_id if isinstance(execution_id, str) and execution_id else None


def backoff(failures: int) -> float:
    return min(BACKOFF_MAX, BACKOFF_FIRST * 2.0**failures)


class Retries:
    """One run of consecutive failures of a call, and its bound: retrying stops `retry_for`
    seconds after the first failure. The last wait is cut to what is left, so that a
    `Retry-After` longer than the bound still gets one last try at its end."""

    def __init__(self, retry_for: float) -> None:
        self.retry_for = retry_for
        self.failures = 0
        self.first_failure: float | None = None
        self.last_try = False

    def received(self) -> None:
        """An answer came: the next failure starts a new run."""
        self.failures = 0
        self.first_failure = None
        self.last_try = False

    def delay(self, wanted: float) -> float | None:
        """Seconds to wait before the next try (at most `wanted`), or None when the failure
        just seen ends the retries."""
        self.failures += 1
        now = time.monotonic()
        if self.first_failure is None:
            self.first_failure = now
        left = self.first_failure + self.retry_for - now
        if self.last_try or left <= 0:
            return None
        self.last_try = wanted >= left
        return min(wanted, left)

    def spent(self) -> str:
        assert self.first_failure is not None
        elapsed = time.monotonic() - self.first_failure
        return f"{counted(self.failures, 'attempt')} in {elapsed:.1f} s"

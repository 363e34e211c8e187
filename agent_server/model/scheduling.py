"""What a reasoner declares about when and how often its executions run (docs/scheduling.md):
a time limit per attempt (`ExecutionTimeout` when it is passed) and a retry policy with
exponential backoff (`RetryPolicy`). The registry applies them; the store queues retries and
delayed starts with the time they are due (`scheduled_at`)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from agent_server.model.names import scoped

#: The longest `?delay=` a start may ask for: seven days.
MAX_DELAY_SECONDS = 7 * 86_400.0


class SessionPolicy(enum.StrEnum):
    """What a start does among the non-terminal executions of its session (`session_policy=`
    on the reasoner, `X-Session-Policy` per request)."""

    #: Runs beside them (the default).
    PARALLEL = "parallel"
    #: Refused (409, naming the busy one) while any is not terminal.
    REJECT = "reject"
    #: Queued; runs after every earlier one ended, in arrival order, on any replica.
    ENQUEUE = "enqueue"
    #: The earlier ones are cancelled (`interrupted`); it runs once they settled.
    INTERRUPT = "interrupt"
    #: As interrupt, and the interrupted records are forgotten.
    ROLLBACK = "rollback"


#: The policies that queue a start behind the session's earlier work (its turn in the
#: session's queue); `reject` only refuses, `parallel` runs beside it.
SESSION_GATED = frozenset({SessionPolicy.ENQUEUE, SessionPolicy.INTERRUPT, SessionPolicy.ROLLBACK})


def limit_key(reasoner: str, value: str, tenant: str | None = None) -> str:
    """The concurrency key of a reasoner's limit: its slots are shared by the starts that
    carry `value` (a header's, a session id, '' for the whole reasoner), per tenant (the
    value scoped by names.py `scoped`). Namespaced `limit:` (a reasoner name has no ':'), so
    no reasoner name or value can name a session's key."""
    return f"limit::{reasoner}:{scoped(tenant, value)}"


def session_key(session_id: str, tenant: str | None = None) -> str:
    """The key of a session's turn (one slot): a start under a gated policy takes it after
    every earlier execution of the session ended; the session's tenant's (`scoped`). The
    Redis scripts name it the same way (`SESSION_GATE`, written into codes.lua from here,
    followed by the scoped session id)."""
    return f"session::{scoped(tenant, session_id)}"


def is_session_key(key: str) -> bool:
    return key.startswith("session:")


class ExecutionTimeout(TimeoutError):
    """An attempt ran longer than its reasoner's `timeout=` (time in `input_required` not
    counted): it was cancelled and ends `failed` with this error, or is retried if its
    `RetryPolicy` matches it."""

    def __init__(self, timeout: float, attempt: int = 1) -> None:
        super().__init__(f"attempt {attempt} ran longer than its timeout of {timeout:g} s")
        self.timeout = timeout
        self.attempt = attempt


def check_timeout(name: str, timeout: float | None) -> float | None:
    """`timeout=` as given to `@agent.reasoner`: None, or positive seconds (at most 7 days
    as a delay is: past that an attempt is no longer a run but a deployment)."""
    if timeout is None:
        return None
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= MAX_DELAY_SECONDS  # NaN, infinities, huge integers: outside
    ):
        raise ValueError(f"reasoner {name!r}: timeout must be positive seconds, at most 7 days")
    return float(timeout)


@dataclass(frozen=True)
class RetryPolicy:
    """Run a failed attempt again: attempt n + 1 starts `initial_delay * backoff ** (n - 1)`
    seconds (at most `max_delay`) after attempt n failed with an exception that is an
    instance of one of `retry_on` (an `ExecutionTimeout` included when `retry_on` covers
    it), up to `max_attempts` attempts in all; the last failure is final."""

    max_attempts: int = 3
    initial_delay: float = 1.0
    backoff: float = 2.0
    max_delay: float = 60.0
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise ValueError("RetryPolicy: max_attempts must be an integer")
        if self.max_attempts < 1:
            raise ValueError("RetryPolicy: max_attempts must be at least 1")
        for name in ("initial_delay", "backoff", "max_delay"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0 <= value < math.inf:
                raise ValueError(f"RetryPolicy: {name} must be a finite number >= 0")
        if self.max_delay > MAX_DELAY_SECONDS:
            raise ValueError("RetryPolicy: max_delay must be at most 7 days")
        if not isinstance(self.retry_on, tuple) or not all(
            isinstance(kind, type) and issubclass(kind, BaseException) for kind in self.retry_on
        ):
            raise ValueError("RetryPolicy: retry_on must be a tuple of exception classes")

    def delay(self, attempt: int) -> float:
        """Seconds between the failure of `attempt` (1, 2, ...) and the next attempt."""
        try:
            seconds = self.initial_delay * self.backoff ** (attempt - 1)
        except OverflowError:
            seconds = self.max_delay
        return min(seconds, self.max_delay)

    def retries(self, exc: BaseException, attempt: int) -> bool:
        """Whether a failure of `attempt` with `exc` runs again."""
        return attempt < self.max_attempts and isinstance(exc, self.retry_on)

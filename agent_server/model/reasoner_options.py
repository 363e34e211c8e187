"""ReasonerOptions: every option of `@agent.reasoner(...)`, declared once with its default
and checked once, when the reasoner is defined (a `ReasonerDefinitionError` naming it).

`Agent.reasoner` spells the same keywords out for its callers' editors and type checkers
and hands them here as they came (tests/unit/test_reasoner.py holds the two together).
What depends on the function itself (its signature, whether it is `async`, whether a
schedule's input binds) is checked by `Reasoner`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field

from agent_server.model.schedules import Schedule
from agent_server.model.scheduling import RetryPolicy, SessionPolicy, check_timeout
from agent_server.model.versions import Migrate, VersionRule, version_rule

#: An HTTP header name (RFC 9110 token), as `concurrency_key="header:NAME"` names one.
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}")


class ReasonerDefinitionError(TypeError):
    """The decorated function cannot be served as a reasoner."""


@dataclass(frozen=True)
class ReasonerOptions:
    """How one reasoner is served: what its author declared, checked, plus what follows
    from it (`attempts`, `policy`, `versions`)."""

    #: What it is served as (`/reasoners/{name}`), and what its definition errors name.
    name: str
    _: KW_ONLY
    #: What the reasoner list and the OpenAPI document say of it; None: the first line of
    #: the function's docstring, so a documented function needs nothing more.
    description: str | None = None
    #: Whether its executions outlive their replica: checkpoints (`ctx.checkpoint`), a
    #: hand-off at shutdown with a shared store, and more attempts after an owner's death.
    #: Off by default: another attempt may redo what the first one did.
    resumable: bool = False
    #: Attempts in all after owners' deaths; None: 3 for a resumable reasoner (a crash
    #: should not end its work), 1 otherwise (only a resumable reasoner may have more).
    max_attempts: int | None = None
    #: Seconds an attempt may run (waiting for input not counted) before it is cancelled
    #: and fails with `ExecutionTimeout`; None: as long as it takes.
    timeout: float | None = None
    #: How a failed attempt runs again, after a backoff (queued with its due time); None:
    #: a failure is final.
    retry: RetryPolicy | None = None
    #: At most this many attempts at once per value of `concurrency_key`, across the
    #: replicas sharing the store (the rest wait queued, first in first out); None: no limit.
    max_concurrency: int | None = None
    #: What one limit counts: "header:NAME" (per value of that request header), "session"
    #: (per session), or None: the whole reasoner.
    concurrency_key: str | None = None
    #: What a start in a session does beside the session's other work (a `SessionPolicy`
    #: value; `X-Session-Policy` overrides it per request). "parallel": nothing waits.
    session_policy: str = "parallel"
    #: When it runs by itself (docs/schedules.md), each schedule's input bound once.
    schedules: Sequence[Schedule] = ()
    #: Its code's version, stamped on its checkpoints; None: the agent's (docs/durable.md,
    #: "Versions"), since most reasoners change with their image.
    version: str | None = None
    #: Other versions whose checkpoints it resumes as they are (None: unversioned code).
    compatible: Sequence[str | None] = ()
    #: `fn(state, from_version) -> state`: reads a checkpoint of any other version.
    migrate: Migrate | None = None
    #: What becomes of a checkpoint it cannot read once no replica of that version is left:
    #: "fail" (the default: never lose state silently) or "restart".
    on_version_change: str = "fail"
    #: The agent's version, which `version` overrides: set by the agent, not a keyword of
    #: `@agent.reasoner`.
    agent_version: str | None = None

    # What follows from the fields above, settled when they are checked.
    #: `max_attempts`, its default applied.
    attempts: int = field(init=False)
    #: `session_policy` as a `SessionPolicy`.
    policy: SessionPolicy = field(init=False)
    #: Its version on this replica and what it resumes besides (model/versions.py).
    versions: VersionRule = field(init=False)

    def __post_init__(self) -> None:
        """Check every option, raising a `ReasonerDefinitionError` that names the reasoner,
        and settle `attempts`, `policy`, `versions` (and `timeout` as a float)."""
        name = self.name
        attempts = self.max_attempts
        if attempts is None:
            attempts = 3 if self.resumable else 1
        if attempts < 1:
            raise ReasonerDefinitionError(f"reasoner {name!r}: max_attempts must be at least 1")
        if attempts > 1 and not self.resumable:
            raise ReasonerDefinitionError(
                f"reasoner {name!r}: only a resumable reasoner may have more than one attempt"
            )
        try:
            timeout = check_timeout(name, self.timeout)
        except ValueError as exc:
            raise ReasonerDefinitionError(str(exc)) from None
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise ReasonerDefinitionError(f"reasoner {name!r}: retry must be a RetryPolicy")
        self._check_concurrency()
        try:
            policy = SessionPolicy(self.session_policy)
        except ValueError:
            raise ReasonerDefinitionError(
                f"reasoner {name!r}: session_policy is one of "
                + ", ".join(policy.value for policy in SessionPolicy)
            ) from None
        try:
            versions = version_rule(
                self.agent_version,
                self.version,
                self.compatible,
                self.migrate,
                self.on_version_change,
            )
        except ValueError as exc:
            raise ReasonerDefinitionError(f"reasoner {name!r}: {exc}") from None
        schedules = tuple(self.schedules)
        if not all(isinstance(schedule, Schedule) for schedule in schedules):
            raise ReasonerDefinitionError(f"reasoner {name!r}: schedules takes Schedule(...)s")
        settle = object.__setattr__  # frozen: what follows is settled once, here
        settle(self, "attempts", attempts)
        settle(self, "timeout", timeout)
        settle(self, "policy", policy)
        settle(self, "versions", versions)
        settle(self, "schedules", schedules)

    def _check_concurrency(self) -> None:
        name, limit, key = self.name, self.max_concurrency, self.concurrency_key
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise ReasonerDefinitionError(f"reasoner {name!r}: max_concurrency must be >= 1")
        if key is not None and limit is None:
            raise ReasonerDefinitionError(
                f"reasoner {name!r}: concurrency_key needs max_concurrency"
            )
        if key is not None and not (
            key == "session"
            or (key.startswith("header:") and HEADER_NAME.fullmatch(key[len("header:") :]))
        ):
            raise ReasonerDefinitionError(
                f"reasoner {name!r}: concurrency_key is 'header:NAME', 'session' or None"
            )
